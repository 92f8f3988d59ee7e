"""The accuracy-vs-speed report: eval and bench records joined into Markdown, CSV and a Pareto plot.

``runs`` (records joined per layout), ``table`` (the table model), ``render`` (Markdown, CSV, notes),
``plot`` (the figure) and ``write`` (the report folder).
"""

from .table import Predicted, Report, build_report
from .write import write_report

__all__ = ["Predicted", "Report", "build_report", "write_report"]
