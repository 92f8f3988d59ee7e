"""``ladderize demo``: the pipeline behind the command (``pipeline``); ``cli/demo.py`` parses and renders."""
