"""The session's files: where a session may work, and what its steps changed.

:mod:`.locations` (which directories a session may have as its Location),
:mod:`.confine` (where a client's or a model's path really leads, symlinks
included, and whether that is inside a root), :mod:`.confined` (file
operations confined to a directory at the moment each is made, for revert),
:mod:`.snapshots` and :mod:`.snapshot_blobs` (a step's before/after trees, for
diff and revert) and :mod:`.watch` (which paths changed since the last
snapshot, from inotify).
"""
