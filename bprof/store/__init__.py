"""The DuckDB trace store: schema, connection, ingest of Kineto traces."""
