"""Print config/debezium-postgres.properties as JSON for the Kafka Connect REST API.

docker-compose registers the result (``config/debezium-postgres.json``) with
``PUT /connectors/txjoin-shop/config``; regenerate it after editing the properties::

    python -m txjoin.stack.render_connector > config/debezium-postgres.json

tests/e2e/test_stack.py checks that the two files agree.
"""

from __future__ import annotations

import sys

from txjoin.stack.debezium import render_json

if __name__ == "__main__":
    sys.stdout.write(render_json())
