"""Zoo cases (filled by its family owner)."""
