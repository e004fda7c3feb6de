"""The results record: its schema and the JSON-lines store."""
