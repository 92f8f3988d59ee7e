"""The sequential stage: the converted layers trained one (or a window) at a time on cached states."""
