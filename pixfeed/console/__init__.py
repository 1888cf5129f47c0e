"""What the user reads: plurals and sizes in words (``words``), plain tables (``texttable``) and
progress bars that go quiet off a TTY (``progress``)."""
