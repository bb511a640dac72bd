"""txjoin: transaction-consistent streaming joins over Debezium change data capture."""

__version__ = "0.1.0"
