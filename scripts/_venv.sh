# Sourced by scripts/test and scripts/serve: makes .venv (if missing) and
# installs sessionrt with its test, dev, postgres and mcp extras whenever the package
# configuration changed since the last install.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(cat setup.cfg pyproject.toml | sha1sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e '.[test,dev,postgres,mcp]'
    rm -f .venv/.installed-*
    touch "$stamp"
fi
