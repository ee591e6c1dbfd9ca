"""``flashcheck report``: the campaign plan and runner, the report run, and the markdown and
figures rendered from its results."""
