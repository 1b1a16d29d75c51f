"""Id marks: where the item and reservation sequences stood at a time, so that "created (reserved) since T" can
start its walk of the primary key at an id instead of reading it to the end.

created_at and reserved_at have no index (one on every open item would cost every enqueue and lease), and a
time filter matching nothing read the whole primary key: 2.5 s at 10M open items. Ids are not stamped in time
order (created_at is the transaction's start; a long transaction inserts late with an early stamp), so no
search of created_at over ids is exact. A mark is: the sequences' last values read first, the clock
(clock_timestamp()) after. A row whose stamp is later than the mark's clock belongs to a transaction that began
after the sequences were read, so its id is above the mark's. Hence, for any T: every row stamped at or after T
has an id above the newest mark taken before T (admin/filters.py's RecentFilter), exactly, whatever ran long.
Rows restored from the history keep their ids and stamps, so the rule holds for them too. With no mark before T
(a new install, no worker running yet) there is no bound: the filter walks as before.

The worker's `id_marks` unit takes one every JOBSITE["ID_MARK_EVERY"] seconds (10; however many workers run: a
worker skips its turn when another's mark is less than 0.9 of that old) and keeps KEEP seconds of them (a
week's window needs a mark from before the week): 69,000 small rows. The rule assumes the database server's
clock never steps back.
"""

from . import sql
from .db import cursor

KEEP = 8 * 86_400.0  # seconds of marks kept: the longest admin window (7 days) and a day


def take_mark(*, spacing: float = 0.0, keep: float = KEEP, using: str | None = None) -> tuple[int, int]:
    """Record where the id sequences stand now, unless a mark was taken in the last `spacing` seconds (another
    worker's), and forget marks older than `keep` seconds; returns (marks taken, marks forgotten)."""
    with cursor(using) as cur:
        cur.execute(sql.ID_MARK_READ)
        item, reservation = cur.fetchone()
        cur.execute(sql.ID_MARK_INSERT, {"item": item, "reservation": reservation, "spacing": float(spacing)})
        taken = cur.rowcount
        cur.execute(sql.ID_MARK_PRUNE, {"keep": float(keep)})
        return taken, cur.rowcount
