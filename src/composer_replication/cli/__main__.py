"""``python -m composer_replication.cli``: the ``composer-replication`` command."""

from composer_replication.cli import app

app(prog_name="composer-replication")
