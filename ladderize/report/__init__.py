"""The accuracy-vs-speed report: eval and bench JSON joined into Markdown, CSV and a Pareto plot."""

from .table import Report, build_report
from .write import write_report

__all__ = ["Report", "build_report", "write_report"]
