"""Taking jobs in: lanes and the read policy, reading the streams, parsing entries, trimming."""
