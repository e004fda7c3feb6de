"""The results record: its schema, the JSON-lines store and the expectations a record is judged by
(``expect_file``, ``expect_check``, and ``expect_gate``, every command's ``--expect``)."""
