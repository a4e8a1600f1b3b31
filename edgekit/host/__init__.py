"""Facts about the machine edgekit runs on: one module per part, each failing soft."""
