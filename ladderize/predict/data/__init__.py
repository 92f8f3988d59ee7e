"""Measured data the shipped predict fits come from (see README.md here and ``ladderize.predict.fit``)."""
