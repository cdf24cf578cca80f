"""The Summary tab: per span name count, total, mean, p50, p99, max, errors, unfinished.

Click a column header (or press s) to sort by it, again to reverse; Enter on a row filters the
timeline to that span name (and moves its window to them when it held none). A note under the table
says that totals add up overlapping spans.
"""

from __future__ import annotations

from textual.binding import Binding
from textual.message import Message
from textual.widgets import DataTable

from rlx.trace.summary import SORT_KEYS, SummaryRow, sort_rows


class SummaryTable(DataTable):
    BINDINGS = [Binding("s", "next_sort", "sort")]

    class NameChosen(Message):
        def __init__(self, name: str) -> None:
            self.name = name
            super().__init__()

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.rows_data: list[SummaryRow] = []
        self.sort_key, self.reverse = "total", None

    def on_mount(self) -> None:
        for key in SORT_KEYS:
            self.add_column(key, key=key)

    def show(self, rows: list[SummaryRow]) -> None:
        self.rows_data = rows
        self._refill()

    def sort_by(self, key: str) -> None:
        if key == self.sort_key:
            self.reverse = (key == "name") if self.reverse is None else not self.reverse
        else:
            self.sort_key, self.reverse = key, None
        self._refill()

    def _refill(self) -> None:
        self.rows_data = sort_rows(self.rows_data, self.sort_key, self.reverse)
        self.clear()
        for row in self.rows_data:
            self.add_row(*row.cells(), key=row.name)

    def action_next_sort(self) -> None:
        self.sort_by(SORT_KEYS[(SORT_KEYS.index(self.sort_key) + 1) % len(SORT_KEYS)])

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        self.sort_by(str(event.column_key.value))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.post_message(self.NameChosen(str(event.row_key.value)))
