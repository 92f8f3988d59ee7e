"""What a stage's loss compares: the objectives' registry (names, traits, parsing; no torch) and their losses."""
