# Sourced by scripts/test, scripts/serve and the other scripts: makes .venv (if
# missing) and installs sessionrt (editable) with the extras the caller names in
# `venv_extras` (comma-separated; default "test,dev,postgres,mcp", what the suite
# needs). scripts/serve names only what its configuration needs, so a first
# start installs the runtime alone; a later scripts/test adds the rest to the
# same .venv.
#
# .venv/.installed-<hash of the package configuration>/ holds one stamp per
# extra installed ("base" for the runtime): an install runs when a wanted one
# is missing, and keeps the extras already there. A changed configuration
# starts from no stamps.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
_stamps=.venv/.installed-$(cat setup.cfg pyproject.toml | sha1sum | cut -c1-12)
if [ -f "$_stamps" ]; then rm -f "$_stamps"; fi  # the one-file stamp of before
_wanted=${venv_extras-test,dev,postgres,mcp}
_missing=
for _extra in base ${_wanted//,/ }; do
    [ -f "$_stamps/$_extra" ] || _missing=1
done
if [ -n "$_missing" ]; then
    _all=$( { tr ',' '\n' <<<"$_wanted"; ls "$_stamps" 2>/dev/null || true; } |
        { grep -v -x -e base -e '' || true; } | sort -u | paste -sd, -)
    # --no-compile: Python compiles a module when it is first imported; pip
    # would compile every module of every package first (seconds on a small
    # machine, for modules a server never imports).
    if [ -n "$_all" ]; then
        .venv/bin/python -m pip install --quiet --no-compile -e ".[$_all]"
    else
        .venv/bin/python -m pip install --quiet --no-compile -e .
    fi
    find .venv -maxdepth 1 -name '.installed-*' ! -path "$_stamps" -exec rm -rf {} +
    mkdir -p "$_stamps"
    for _extra in base ${_all//,/ }; do
        touch "$_stamps/$_extra"
    done
fi
unset _stamps _wanted _missing _all _extra
