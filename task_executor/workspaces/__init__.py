"""Working trees at a commit: repository mirrors, prepared templates (setup done once, kept
read-only), copy-on-write workspaces over them with snapshots and forks, and the git and
filesystem helpers these need.

May import sandbox (setup runs in it) and the shared ``config`` / ``errors``; nothing above.
"""
