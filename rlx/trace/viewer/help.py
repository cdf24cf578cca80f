"""The viewer's help (``?``): every key and mouse action of the timeline, the tabs and the filter, in one
screen that any key closes. Kept beside the bindings it lists; the footer shows only the common ones."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.screen import ModalScreen
from textual.widgets import Static

from rlx.trace.query import SPECIAL_KEYS

HELP = f"""[b]rlx trace-view: keys[/b]

[b]Tabs[/b]       1 timeline   2 summary   3 metrics   q quit   ? this help
[b]Timeline[/b]   ←/→ cursor   a/d or shift+←/→ pan   w/s or +/- zoom around the cursor   0 fit
           ↑/↓ rows   enter select the span under the cursor   f zoom to it
           space expand a server's requests row into one row per request
[b]Mouse[/b]      wheel zooms around the pointer, shift+wheel pans, drag pans, click selects
[b]Summary[/b]    s or a click on a header sorts (again: reverse)   enter shows that span name on the
           timeline (the window moves to those spans when it held none)
           total adds up every span's duration: spans that overlap are each counted, so a
           total can exceed the wall time
[b]Filter[/b]     / to type, enter applies, esc clears; terms combine with AND:
           gen (name contains)   name=generate   finish_reason=length   completion_tokens>=200
           dur>50ms   status=error|unfinished|ok   keys: {", ".join(SPECIAL_KEYS)} or any attribute

any key closes this help"""


class HelpScreen(ModalScreen):
    CSS = """
    HelpScreen { align: center middle; }
    #help { width: auto; max-width: 100%; height: auto; padding: 1 2; border: round $accent; background: $panel; }
    """

    def compose(self) -> ComposeResult:
        # the text is the box: a width-auto container around a Static (1fr wide by default) laid out at 0x0
        yield Static(HELP, id="help")

    def on_key(self, event) -> None:
        event.stop()
        self.dismiss()
