"""Where a workload's CC tax goes: two traces of the same program compared call by call.

`ccbridge account BASE OTHER` reads two traces in ccbridge's trace schema
(`ccbridge run --record`: natively, emulated, or on a real CC-on machine)
and attributes the difference of their wall times to the driver calls that
grew: per API, direction and memory kind, how many calls, their time per call
in each trace, what the other trace's time was spent on (waiting for the
stream, for the channel, tolls), the share of the slowdown the growth
explains, and the recovery that fits it. `ccbridge account --profile b300 --
CMD` records CMD natively, then under the emulator, and compares the two.

Of which slowdown: with `--profile` the runs' launch and end times split
the wall time into start-up (to the first traced driver call), the span of
traced calls, and teardown; the shares are of the span's slowdown, which
calls can explain (a cold start of one process swung the wall time by +-3 s
on an H100). Two traces given: of the traces' spans. A program that pauses
its trace (trace.paused(); bench decode traces only its timed runs) leaves
the paused stretches before its first and after its last traced call out of
the span, but not those between: account one configuration at a time.

The shares are of time spent inside calls, summed over threads: where one
thread's calls hold the program's critical path (a serving loop's scheduler,
a training step's host side) they explain the wall time; where several
threads wait at once they can add up to more than the slowdown. A wait that
moved (a step's synchronize natively, the head-of-line H2D before it under
CC) shows as growth in one row and shrinkage in another; the rows sum to the
calls' net change. A job of several processes is compared rank by rank: account_ranks.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from ccbridge.emulate.trace import TraceSummary
from ccbridge.results import Row
from ccbridge.textfit import WIDTH, cut as _cut, wrap as _wrap
from ccbridge.ui import approx_bytes

SMALL = 64 << 10  # bytes: a crossing this small is mostly toll
BETWEEN_CALLS = "time between calls (host work and waits outside traced calls)"  # a slowdown less the calls' part


@dataclass
class Line:
    api: str
    kind: str
    dir: str
    mem: str
    calls: tuple[int, int]
    in_call_ms: tuple[float, float]
    stream_wait_ms: float  # in the other trace
    channel_wait_ms: float
    toll_ms: float
    bytes: int
    share: float  # of the slowdown: the driver-call span's where the runs' phases are known, else the wall time's
    recovery: str
    site: str = ""  # the Python call site (file:line function -> callee) where the traces noted sites
    device_ms: tuple[float, float] = (0.0, 0.0)  # collectives: GPU time queued ahead of them (toll_ns), each trace
    moved_ms: float = 0.0  # host waits the collectives' GPU time explains: + on collectives, - on the waits
    replays: int = 0  # collectives: of the other trace's operations, those a CUDA graph launch ran again

    @property
    def in_call_delta_ms(self) -> float:
        return self.in_call_ms[1] - self.in_call_ms[0]

    @property
    def delta_ms(self) -> float:
        """The growth this line is charged with: its time in calls, plus the waits moved to it (collective_waits())."""
        return self.in_call_delta_ms + self.moved_ms

    @property
    def what(self) -> str:
        """dir/mem in a few characters; a collective's mean payload per operation."""
        if self.kind == "collective":
            return f"{approx_bytes(self.bytes / self.calls[1])}/op" if self.calls[1] else "-"
        return " ".join(v for v in (self.dir, self.mem) if v not in ("", "-")) or "-"

    @property
    def queued(self) -> str:
        """A collective's device time as the emulator recorded it (toll_ns): queued on its stream ahead of it, not
        the collective's own GPU time (none natively: a native trace records no toll), BASE -> OTHER."""
        return (f"device time the emulator queued ahead of them (toll_ns) {self.device_ms[0]:.2f} -> "
                f"{self.device_ms[1]:.2f} ms")

    def per_call_us(self, i: int) -> float:
        return self.in_call_ms[i] * 1e3 / self.calls[i] if self.calls[i] else 0.0


# What each recovery is called in the 120-column table (the full text goes to --why, --json and the reports).
RECOVERIES = {
    "CUDA graphs": "CUDA graphs: one launch toll per graph instead of one per kernel",
    "fewer syncs": "fewer synchronizes on the critical thread: read back on a ccbridge.serve.DrainWorker",
    "keep contexts": "create contexts once and keep them (each pays the CC context setup; ccbridge's loader pools them)",
    "reuse pinned": "allocate pinned buffers once and reuse them (each allocation pays the CC toll)",
    "DrainWorker": "drain on a worker (ccbridge.serve.DrainWorker): the readback waits for the stream",
    "StagedH2D": "stage on an idle stream (ccbridge.serve.StagedH2D): the copy waits for queued work",
    "pack readbacks": "pack small readbacks into one (gather a step's results on the device, one D2H)",
    "pack crossings": "pack small crossings into one (ccbridge.serve.StagedH2D packs a step's inputs)",
    "context pool": "more contexts (a context pool, as ccbridge's loader keeps): one context's channel is serialized",
    "fewer crossings": "larger, fewer crossings: each pays a fixed toll",
    "fewer collectives": "fewer, larger collectives: each pays a per-operation toll (DDP bucket_cap_mb, a fused "
                         "all-reduce, a narrower TP degree); CUDA graphs drop their launch tolls, not this one",
    "overlap collectives": "overlap collectives with compute, or a narrower TP degree: large ones pay for the link "
                           "bandwidth CC keeps",
    # what a CC driver answers, not a cost (advise's cc_answers says the same)
    "%globaltimer": "time GPU work with %globaltimer stamps where CC is on (CUDA event timing is unreliable under CC; "
                    "ccbridge: --timer globaltimer)",
    "no is_pinned gate": "don't gate a live view or a re-pin on is_pinned(): under CC pinned memory reads as managed "
                         "(take the view with cudaHostGetDevicePointer; keep pinned buffers)",
}
COLLECTIVE_SMALL = 1 << 20  # bytes per operation up to which the per-operation toll dominates (bridge law, section 6)


def recovery(kind: str, direction: str, calls: int, nbytes: int, stream_ms: float, channel_ms: float,
             toll_ms: float) -> str:
    """The recovery a row's dominant cost calls for (bridge law; ccbridge.serve)."""
    return RECOVERIES[_recovery(kind, direction, calls, nbytes, stream_ms, channel_ms, toll_ms)]


def recovery_name(text: str) -> str:
    """A recovery's name in RECOVERIES ("" for none)."""
    return next((k for k, v in RECOVERIES.items() if v == text), "")


def _recovery(kind, direction, calls, nbytes, stream_ms, channel_ms, toll_ms) -> str:
    if kind == "collective":
        return "fewer collectives" if calls and nbytes / calls <= COLLECTIVE_SMALL else "overlap collectives"
    # every kind but crossings has its own; a crossing's follows what it waited for
    own = {"launch": "CUDA graphs", "sync": "fewer syncs", "context": "keep contexts", "alloc": "reuse pinned",
           "timing": "%globaltimer", "query": "no is_pinned gate"}
    if kind in own:
        return own[kind]
    if stream_ms >= max(channel_ms, toll_ms):
        return "DrainWorker" if direction == "d2h" else "StagedH2D"
    if calls and nbytes / calls < SMALL:
        return "pack readbacks" if direction == "d2h" else "pack crossings"
    if channel_ms >= toll_ms:
        return "context pool"
    return "fewer crossings"


def collective_waits(lines: list["Line"]) -> float:
    """Move the host waits that collectives' GPU time explains onto the collectives; the ms moved.

    A collective's toll_ns is device time: the emulator queued it on the op's stream ahead of the op, and the
    host's call returned without waiting for it. The host meets it later, as a synchronize or a readback that
    waits longer for the stream. Counted as it falls, that time would sit in those waits and the collectives
    would look free; counted on both, twice. The rule: the collectives' growth of device time (other less base,
    summed) is taken, up to the room the waits grew by, from the waits and given to the collectives, each
    collective in proportion to its own device growth, each wait in proportion to its room. A wait's room is
    what of its growth can be waiting for the GPU: a synchronize's growth beyond its own round-trip tolls, a
    crossing's up to what it waited for its stream. Device time no wait grew by (the GPU was busy with it but
    the host never waited: overlapped) stays with the waits' rows, that is nowhere: it is shown as GPU time,
    not as slowdown. The rows still sum to the calls' net change. A record-only trace (CC-on hardware) has
    no toll_ns, so nothing moves there: its collectives hold only their host calls."""
    gpu = {id(x): x.device_ms[1] - x.device_ms[0] for x in lines
           if x.kind == "collective" and x.device_ms[1] > x.device_ms[0]}
    room = {id(x): r for x in lines if (r := _wait_room(x)) > 0}
    moved = min(sum(gpu.values()), sum(room.values()))
    if moved > 0:
        g, r = sum(gpu.values()), sum(room.values())
        for x in lines:
            x.moved_ms += moved * (gpu.get(id(x), 0.0) / g - room.get(id(x), 0.0) / r)
    return max(moved, 0.0)


def _wait_room(x: "Line") -> float:
    grew = x.in_call_delta_ms
    if grew <= 0:
        return 0.0
    if x.kind == "sync":
        return max(0.0, grew - x.toll_ms)
    if x.kind == "crossing":
        return min(grew, x.stream_wait_ms)
    return 0.0


PHASES = ("start-up", "driver calls", "teardown")  # launch -> first call -> last call -> exit


def attribute(base: TraceSummary, other: TraceSummary, base_wall_s: float | None = None,
              other_wall_s: float | None = None, share_of_s: float | None = None) -> tuple[list[Line], float]:
    """The lines, largest growth first, and the wall-time slowdown (wall_slowdown()); each line's share is of
    share_of_s (default: that wall-time slowdown)."""
    wall = wall_slowdown(base, other, base_wall_s, other_wall_s)
    return compared(base.by_api, other.by_api, wall if share_of_s is None else share_of_s), wall


def wall_slowdown(base: TraceSummary, other: TraceSummary, base_wall_s: float | None = None,
                  other_wall_s: float | None = None) -> float:
    """Other's wall time less base's (s): the programs' own where given, else the traces' spans."""
    return ((other_wall_s if other_wall_s is not None else other.span_ns / 1e9)
            - (base_wall_s if base_wall_s is not None else base.span_ns / 1e9))


def share_base(wall_s: float, where: dict[str, float]) -> float:
    """The slowdown the shares are of: between the first and the last driver call where the phases are
    known (what calls can explain; a cold start of one process is no call's), else the wall time's."""
    return where["driver calls"] if where else wall_s


def phase_times(t: TraceSummary, run: tuple[int, int] | None) -> dict[str, float]:
    """One run's phases (s): from the program's launch to its first traced driver call (start-up: imports, model
    building, and whatever the program ran with its trace paused), from the first traced call to the last (where
    the calls can explain a slowdown), from the last to the program's end (teardown). Empty without the run's
    launch and end times (two traces given) or a trace without calls."""
    if not run or t.first_ns is None:
        return {}
    return dict(zip(PHASES, ((t.first_ns - run[0]) / 1e9, (t.last_ns - t.first_ns) / 1e9, (run[1] - t.last_ns) / 1e9)))


def by_phase(base: dict[str, float], other: dict[str, float]) -> dict[str, float]:
    """Where the slowdown fell: each phase's OTHER less BASE (s, phase_times()); empty where either is not known."""
    return {k: other[k] - base[k] for k in PHASES} if base and other else {}


def phases(base: TraceSummary, other: TraceSummary, base_run: tuple[int, int] | None,
           other_run: tuple[int, int] | None) -> dict[str, float]:
    """Where the slowdown of one run fell, phase by phase (by_phase() of the two runs' phase_times())."""
    return by_phase(phase_times(base, base_run), phase_times(other, other_run))


def net_in_calls_s(lines: list[Line]) -> float:
    """The change of time inside driver calls, growth less shrinkage (a wait that moved from one call to
    another, as a synchronize's into a head-of-line H2D, counts once)."""
    return sum(x.delta_ms for x in lines) / 1e3


def attribute_sites(base: TraceSummary, other: TraceSummary, wall_s: float) -> list[Line]:
    """The same per Python call site and API, where both runs noted sites (else none)."""
    if not base.by_site or not other.by_site:
        return []
    return compared(base.by_site, other.by_site, wall_s)


def compared(btab: dict, otab: dict, wall: float) -> list[Line]:
    """Two traces' tables (per API, or per site and API) as Lines, each's share of `wall` (s) given."""
    lines = []
    for key in set(btab) | set(otab):
        b, o = btab.get(key, {}), otab.get(key, {})
        calls = (b.get("count", 0), o.get("count", 0))
        in_call = (b.get("blocked_ns", 0) / 1e6, o.get("blocked_ns", 0) / 1e6)
        sw, cw, tl = (o.get(k, 0) / 1e6 for k in ("stream_wait_ns", "channel_wait_ns", "toll_ns"))
        kind = o.get("kind") or b.get("kind", "")
        site, (api, d, m) = (key[0], key[1:]) if len(key) == 4 else ("", key)
        device = (b.get("toll_ns", 0) / 1e6, tl) if kind == "collective" else (0.0, 0.0)
        lines.append(Line(api, kind, d, m, calls, in_call, sw, cw, tl, o.get("bytes", 0), 0.0, "", site, device,
                          replays=o.get("replays", 0)))
    collective_waits(lines)
    for x in lines:
        x.share = x.delta_ms / (wall * 1e3) if wall > 0 else 0.0
        # a call that did not grow calls for no recovery
        x.recovery = recovery(x.kind, x.dir, x.calls[1], x.bytes, x.stream_wait_ms, x.channel_wait_ms,
                              x.toll_ms) if x.delta_ms > 0 else ""
    lines.sort(key=lambda x: -x.delta_ms)
    return lines


def rows(lines: list[Line], wall_s: float, site_lines: list[Line] = (), where: dict[str, float] | None = None,
         spans: bool = False, base_s: float | None = None) -> list[Row]:
    """The account as Rows of a Result (one format for compare, advise and reports): account.api per API,
    account.site per call site and API, account.phase per phase of the run (where: phases()). spans: the
    slowdown is of two given traces' spans, not of the programs' wall times. base_s: BASE's seconds of what the
    shares are of (render()). A line's share is of its in_call_delta plus its waits_moved (collective_waits());
    collectives add their gpu_time and payload_per_op."""
    of = share_base(wall_s, where or {})
    out = [Row.of("account.total", "wall_slowdown", "s", [wall_s]),
           Row.of("account.total", "net_in_calls", "s", [net_in_calls_s(lines)]),
           Row.of("account.total", "between_calls", "s", [of - net_in_calls_s(lines)]),
           Row.of("account.total", "share_base", "s", [of])]
    out[0].extra["of"] = ("the traces' spans (first to last driver call)" if spans and not where else
                          "the programs' wall times (launch to exit)")
    out[2].extra["what"] = f"{BETWEEN_CALLS}: the slowdown the shares are of less the driver calls' net change"
    out[-1].extra["of"] = ("the driver-call span's slowdown" if where else
                           "the traces' spans' slowdown (first to last call)" if spans else "the wall-time slowdown")
    if base_s is not None:
        out[-1].extra.update(base_s=base_s, other_s=base_s + of)
    if any(x.kind == "collective" for x in lines):
        gpu, seen = collectives_gpu_ms(lines)
        out += [Row.of("account.total", "collective_gpu_growth", "s", [gpu / 1e3]),
                Row.of("account.total", "collective_waits", "s", [seen / 1e3])]
        out[-2].extra["what"] = "device time queued ahead of the collectives, other less base (EMULATED toll_ns)"
        out[-1].extra["what"] = "of it, what the host waited for in synchronizes and readbacks (moved to them)"
    out += [Row.of("account.phase", "slowdown", "s", [v], phase=k) for k, v in (where or {}).items()]
    for test, group in (("account.api", lines), ("account.site", site_lines)):
        for x in group:
            p = dict(api=x.api, kind=x.kind, dir=x.dir, mem=x.mem, **({"site": x.site} if x.site else {}))
            out.append(Row.of(test, "in_call_delta", "ms", [x.in_call_delta_ms], **p))
            out[-1].extra.update(stream_wait_ms=x.stream_wait_ms, channel_wait_ms=x.channel_wait_ms, toll_ms=x.toll_ms)
            if x.moved_ms:
                out.append(Row.of(test, "waits_moved", "ms", [x.moved_ms], **p))
            if x.kind == "collective":
                out += collective_rows(test, x, p)
            out += [Row.of(test, "per_call_base", "us", [x.per_call_us(0)], **p),
                    Row.of(test, "per_call_other", "us", [x.per_call_us(1)], **p),
                    Row.of(test, "share_of_slowdown", "fraction", [x.share], **p)]
            out[-1].extra["recovery"] = x.recovery
            out[-1].extra["calls"] = list(x.calls)
    return out


def collective_rows(test: str, x: Line, params: dict) -> list[Row]:
    """A collective's evidence beside its share: its device time (OTHER's; BASE's in extra) and payload per op."""
    gpu = Row.of(test, "gpu_time", "ms", [x.device_ms[1]], **params)
    gpu.extra["base_ms"] = x.device_ms[0]
    return [gpu, Row.of(test, "payload_per_op", "B", [x.bytes / x.calls[1] if x.calls[1] else 0.0], **params)]


NOISE = 0.01  # a window's slowdown within this fraction of its base window (or NOISE_MS) is no slowdown
NOISE_MS = 0.05


def measurable(slowdown_s: float, base_s: float) -> bool:
    """A slowdown beyond noise: more than NOISE of the base (or NOISE_MS); else no shares are given."""
    return slowdown_s > max(NOISE * base_s, NOISE_MS / 1e3)


def collectives_gpu_ms(lines: list[Line]) -> tuple[float, float]:
    """The collectives' device time growth (ms, other less base) and what of it the host waited for (moved)."""
    col = [x for x in lines if x.kind == "collective"]
    return sum(x.device_ms[1] - x.device_ms[0] for x in col), sum(x.moved_ms for x in col)


def render_sites(lines: list[Line], top: int = 10) -> str:
    """The call sites whose calls grew most: where in the program to apply each recovery (the full site: --why)."""
    if not lines:
        return ""
    out = [f"by call site (the innermost frame outside torch and the stdlib; top {min(top, len(lines))}):",
           f"{'+ms':>9} {'share':>6} {'calls':>13} {'us/call':>17}  {'api':<22} site"]
    for x in lines[:top]:
        row = (f"{x.delta_ms:>9.2f} {x.share:>6.0%} {x.calls[0]:>6}/{x.calls[1]:<6} "
               f"{x.per_call_us(0):>8.1f}/{x.per_call_us(1):<8.1f}  {_cut(x.api, 22):<22} ")
        out.append(row + short_site(x.site, WIDTH - len(row)))
    return "\n".join(out)


def short_site(site: str, width: int) -> str:
    """A call site (`path/file.py:LINE function -> callee`) in `width` columns, file:line and function kept: the
    path's leading folders dropped first, then the callee's leading modules (torch.nn.functional.silu: silu), then
    its end cut."""
    where, arrow, callee = site.partition(" -> ")
    path, space, function = where.partition(" ")
    folders, modules = path.split("/"), callee.split(".")
    while (len(text := "/".join(folders) + space + function + arrow + ".".join(modules)) > width
           and (len(folders) > 1 or len(modules) > 1)):
        del (folders if len(folders) > 1 else modules)[0]
    return _cut(text, width)


def render(lines: list[Line], wall_s: float, top: int = 15, where: dict[str, float] | None = None,
           emulated: str | None = None, shares: bool = True, base_s: float | None = None) -> str:
    """The account in 120 columns: the head, one row per call family, the recovery's name (emulated: the OTHER
    trace's profile, which every figure below is of). base_s: BASE's seconds of what the shares are of (its
    driver-call span where the phases are known, else its trace's span), for the head's base -> other."""
    head = ([f"EMULATED: OTHER ran under the emulator (profile {emulated}); no figure below is a CC hardware "
             "measurement"] if emulated else [])
    of = share_base(wall_s, where or {})
    if where:
        head.append(f"wall time (launch to exit) {wall_s * 1e3:+.1f} ms: "
                    + ", ".join(f"{k} {v * 1e3:+.1f} ms" for k, v in where.items()))
    what = ("the driver-call span (first to last driver call; a start-up or a teardown is no call's)" if where else
            "the traces' span (first to last driver call)")
    sides = f" {base_s * 1e3:.1f} -> {(base_s + of) * 1e3:.1f} ms," if base_s is not None else ""
    rel = f" ({of / base_s:+.1%})" if base_s else ""
    head.append(f"{what}{sides} {of * 1e3:+.1f} ms{rel}" + (f", which the shares below are of: {calls_part(lines, of)}"
                if shares else f": no measurable slowdown, no shares; the driver calls' net change "
                f"{net_in_calls_s(lines) * 1e3:+.1f} ms"))
    out = [*_wrap(head), f"{'api':<24} {'kind':<10} {'dir/mem':<14} {'calls':>13} {'us/call':>17} {'+ms':>9} "
                         f"{'share':>6}  recovery (--why)"]
    for x in lines[:top]:
        out.append(f"{_cut(x.api, 24):<24} {x.kind:<10} {x.what:<14} {x.calls[0]:>6}/{x.calls[1]:<6} "
                   f"{x.per_call_us(0):>8.1f}/{x.per_call_us(1):<8.1f} {x.delta_ms:>9.2f} "
                   f"{f'{x.share:.0%}' if shares else '-':>6}  {recovery_name(x.recovery) if shares else ''}")
    notes = []
    if any(x.kind == "collective" for x in lines):
        gpu, seen = collectives_gpu_ms(lines)
        notes.append(f"collectives: {gpu:.1f} ms more GPU time (the emulator's per-operation toll and bandwidth, "
                     f"queued on their streams: EMULATED); the host waited for {seen:.1f} ms of it in synchronizes "
                     "and readbacks, which the rows above charge to the collectives, not to the waits"
                     if gpu > 0 else "collectives: no device time recorded (a record-only trace): their rows hold "
                     "only the host calls")
    waited = sum(x.stream_wait_ms for x in lines if x.delta_ms > 0)
    for x in lines:  # a synchronize that shrank while crossings grew waiting for their streams: the same wait, moved
        if x.kind == "sync" and x.delta_ms < 0 and waited >= -x.delta_ms / 2:
            notes.append(f"{x.api} shrank {-x.delta_ms:.1f} ms: natively it waited for the GPU; under CC the "
                         f"crossings above wait for their streams instead ({waited:.1f} ms), ahead of the host work "
                         "they used to overlap (head-of-line)")
    return "\n".join(out + _wrap(notes))


def calls_part(lines: list[Line], of_s: float) -> str:
    """Of a slowdown of_s (s): what the calls that grew explain, net of those that shrank where that differs, and
    the rest, time between calls (net: the rows sum to the calls' net change; the rest is of_s less it)."""
    explained, net = sum(x.delta_ms for x in lines if x.delta_ms > 0) / 1e3, net_in_calls_s(lines)
    pct = lambda v: f" ({v / of_s:.0%})" if of_s > 0 else ""
    text = f"calls that grew explain {explained * 1e3:.1f} ms" + pct(explained)
    if f"{net * 1e3:.1f}" != f"{explained * 1e3:.1f}":  # some calls shrank
        text += f", net of the calls that shrank {net * 1e3:.1f} ms" + pct(net)
    return text + f"; the rest, {(of_s - net) * 1e3:+.1f} ms" + pct(of_s - net) + f", is {BETWEEN_CALLS}"


def kind_dir_mem(kind: str, direction: str, mem: str) -> str:
    """A call family's label: kind/dir/mem, an empty or '-' part left out (a launch: 'launch')."""
    return "/".join(v for v in (kind, direction, mem) if v not in ("", "-"))


def render_why(lines: list[Line], site_lines: list[Line] = (), top: int = 15) -> str:
    """--why: the evidence behind each row of the tables, wrapped to 120 columns."""
    out = []
    for title, group in (("by API", lines), ("by call site", site_lines)):
        if group:
            out.append(f"{title}:")
        for x in group[:top]:
            text = (f"{x.api} ({kind_dir_mem(x.kind, x.dir, x.mem)})" + (f" at {x.site}" if x.site else "")
                    + f": calls {x.calls[0]} -> {x.calls[1]}, {x.per_call_us(0):.1f} -> {x.per_call_us(1):.1f} us per "
                    f"call; in calls {x.in_call_delta_ms:+.2f} ms")
            if x.moved_ms:
                text += f", waits moved {x.moved_ms:+.2f} ms (collective_waits)"
            text += (f"; charged {x.delta_ms:+.2f} ms, {x.share:.1%} of the slowdown; in the other trace waiting for "
                     f"the stream {x.stream_wait_ms:.2f} ms, the channel {x.channel_wait_ms:.2f} ms, tolls "
                     f"{x.toll_ms:.2f} ms")
            if x.kind == "collective":
                text += (f"; {x.queued}, "
                         f"{approx_bytes(x.bytes / x.calls[1]) if x.calls[1] else '-'} per operation")
            out += _wrap([text + (f"; recovery: {x.recovery}" if x.recovery else "")], indent="    ")
    return "\n".join(out)
