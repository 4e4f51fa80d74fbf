"""`dflash-gguf watch URL`: a running llama-server's acceptance, live, one line per slot.

Every `--interval` seconds it reads GET /slots (which slots decode, how many tokens each has made)
and GET /metrics (llama-server --metrics; `dflash-gguf serve` starts it so): the drafted, accepted
and verify-step counters and the accepted tokens at each draft position. From those, per slot:

    tau            1 + accepted / verify steps (tokens gained per target step)
    by depth       at depth i, the share of verify steps whose draft was accepted that far
    tok/s          the slot's new tokens over the interval (the server's average when idle)
    draft n        drafted tokens per verify step: the draft length in use

The counters are the server's (llama-server keeps them for all slots together); a slot's own,
where the server's /slots gives them (draft_n, draft_n_accepted, draft_offered_per_depth,
draft_accepted_per_depth, as the patched server's response timings carry them), are used instead.

A reply is read up to BODY_LIMIT bytes and checked before anything is taken from it: a server that is
gone is one line and exit 1; one that is not llama-server, or answers garbage (HTML, invalid JSON, an
endless body, a metric that is not a number), one line and exit 2.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any, TextIO

import click

from dflash_gguf.errors import DflashError
from dflash_gguf.options import json_option
from .client import METRIC_PREFIX, LlamaClient, is_server_url

BODY_LIMIT = 4 << 20  # bytes of one reply: /slots of 256 slots, /metrics of a long draft, with room
_SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)(\s+\S+)?$')
_POSITION = re.compile(r'^\{position="(\d{1,4})"\}$')
PER_POSITION = "spec_decode_num_accepted_tokens_per_pos_total"
SLOT_COUNTERS = ("draft_n", "draft_n_accepted")
SLOT_DEPTHS = ("draft_offered_per_depth", "draft_accepted_per_depth", "draft_n_chosen_hist")


class WatchError(DflashError):
    """Not llama-server, or garbage from it (exit 2)."""


class ServerGone(WatchError):
    """Nothing answers at the URL (exit 1)."""

    exit_code = 1


@dataclass
class Counters:
    """llama-server's speculative counters (/metrics), and its average generation speed."""

    draft_tokens: float
    accepted_tokens: float
    drafts: float
    accepted_per_position: list[float]
    predicted_per_second: float | None


@dataclass
class SlotLine:
    id: int
    processing: bool
    n_decoded: int | None
    scope: str                        # "slot": the slot's own counters; "server": all slots together
    draft_tokens: int
    accepted_tokens: int
    drafts: int | None
    tau: float | None
    acceptance: float | None
    acceptance_by_depth: list[float]
    tokens_per_second: float | None
    draft_length: float | None

    def text(self) -> str:
        state = "busy" if self.processing else "idle"
        tau = f"tau {self.tau:.2f}" if self.tau is not None else "tau n/a"
        depth = " ".join(f"{a:.2f}" for a in self.acceptance_by_depth[:16]) or "n/a"
        speed = f"{self.tokens_per_second:.1f} tok/s" if self.tokens_per_second is not None else "n/a tok/s"
        n = f"draft n {self.draft_length:.1f}" if self.draft_length is not None else "draft n n/a"
        scope = "" if self.scope == "slot" else " (server)"
        return f"slot {self.id} {state}: {tau}{scope} | by depth {depth} | {speed} | {n}"


def checked_url(url: str) -> str:
    if not is_server_url(url):
        raise WatchError(f"URL {url!r}: give a running llama-server's address, e.g. http://127.0.0.1:8080")
    return url.rstrip("/")


def _get(client: LlamaClient, path: str, timeout: float) -> bytes:
    """GET `path`: the body, read up to BODY_LIMIT (the client's proxy rule and API key)."""
    req = urllib.request.Request(client.url + path, method="GET",
                                 headers={"Authorization": f"Bearer {client.api_key}"} if client.api_key else {})
    where = f"{client.url}{path}"
    try:
        with client._opener().open(req, timeout=timeout) as resp:
            body = resp.read(BODY_LIMIT + 1)
    except urllib.error.HTTPError as err:
        hint = " (start llama-server with --metrics)" if path == "/metrics" and err.code == 501 else ""
        raise WatchError(f"GET {where}: HTTP {err.code}{hint}; is this a llama-server?") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        raise ServerGone(f"cannot reach llama-server at {client.url} ({reason}); is it running?") from None
    if len(body) > BODY_LIMIT:
        raise WatchError(f"GET {where}: the answer is over {BODY_LIMIT >> 20} MiB; this is not llama-server")
    return body


def read_slots(client: LlamaClient, timeout: float) -> list[dict[str, Any]]:
    body = _get(client, "/slots", timeout)
    try:
        slots = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise WatchError(f"GET {client.url}/slots: the answer is not JSON; this is not llama-server") from None
    if not isinstance(slots, list) or not all(isinstance(s, dict) and type(s.get("id")) is int for s in slots):
        raise WatchError(f"GET {client.url}/slots: not a list of slots with ids; this is not llama-server")
    return slots


def parse_counters(text: str, where: str) -> Counters:
    """llama-server's counters from its Prometheus text, every llamacpp: sample checked to be a number."""
    values: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise WatchError(f"GET {where}: {line[:80]!r} is not a Prometheus sample; this is not llama-server")
        name, labels, raw = m.group(1), m.group(2), m.group(3)
        if not name.startswith(METRIC_PREFIX):
            continue
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if math.isnan(value) or value < 0:
            raise WatchError(f"GET {where}: {name} is {raw[:40]!r}, not a count; this is not a llama-server answer")
        name = name[len(METRIC_PREFIX):]
        if name == PER_POSITION:
            pos = _POSITION.match(labels or "")
            if pos is None:
                raise WatchError(f"GET {where}: {name} with labels {labels!r}; this is not a llama-server answer")
            per_pos[int(pos.group(1))] = value
        elif labels is None:
            values[name] = value
    if "tokens_predicted_total" not in values:
        raise WatchError(f"GET {where}: no llamacpp:tokens_predicted_total; this is not llama-server's /metrics")
    n = max(per_pos) + 1 if per_pos else 0
    speed = values.get("predicted_tokens_seconds")
    return Counters(values.get("spec_decode_num_draft_tokens_total", 0.0),
                    values.get("spec_decode_num_accepted_tokens_total", 0.0),
                    values.get("spec_decode_num_drafts_total", 0.0),
                    [per_pos.get(i, 0.0) for i in range(n)], speed if speed is not None and speed > 0 else None)


def read_counters(client: LlamaClient, timeout: float) -> Counters:
    body = _get(client, "/metrics", timeout)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise WatchError(f"GET {client.url}/metrics: the answer is not text; this is not llama-server") from None
    return parse_counters(text, f"{client.url}/metrics")


def _number_list(slot: dict, key: str) -> list[float] | None:
    value = slot.get(key)
    if isinstance(value, list) and all(type(v) in (int, float) and v >= 0 for v in value):
        return [float(v) for v in value]
    return None


def _own(slot: dict) -> dict | None:
    """A slot's own draft counters, when the server gives them (in the slot or its `timings`)."""
    for source in (slot, slot.get("timings")):
        if isinstance(source, dict) and all(type(source.get(k)) is int for k in SLOT_COUNTERS):
            return source
    return None


def slot_line(slot: dict, counters: Counters, n_before: int | None, seconds: float | None) -> SlotLine:
    own = _own(slot)
    processing = slot.get("is_processing") is True
    next_token = slot.get("next_token")
    decoded = next_token[0].get("n_decoded") if isinstance(next_token, list) and next_token and \
        isinstance(next_token[0], dict) else None
    decoded = decoded if type(decoded) is int and decoded >= 0 else None
    speed = None
    if processing and decoded is not None and n_before is not None and seconds and decoded >= n_before:
        speed = (decoded - n_before) / seconds
    speed = speed if speed is not None else counters.predicted_per_second
    if own is not None:
        drafted, accepted = own["draft_n"], own["draft_n_accepted"]
        offered, taken = _number_list(own, SLOT_DEPTHS[0]), _number_list(own, SLOT_DEPTHS[1])
        by_depth = [a / o if o else 0.0 for a, o in zip(taken or [], offered or [], strict=False)]
        hist = _number_list(own, SLOT_DEPTHS[2])
        steps = sum(hist) if hist else None
        length = sum(i * c for i, c in enumerate(hist)) / steps if hist and steps else None
        tau = 1.0 + accepted / steps if steps else None
        return SlotLine(slot["id"], processing, decoded, "slot", drafted, accepted, int(steps) if steps else None,
                        tau, accepted / drafted if drafted else None, by_depth, speed, length)
    drafts = counters.drafts
    return SlotLine(slot["id"], processing, decoded, "server", int(counters.draft_tokens),
                    int(counters.accepted_tokens), int(drafts),
                    1.0 + counters.accepted_tokens / drafts if drafts else None,
                    counters.accepted_tokens / counters.draft_tokens if counters.draft_tokens else None,
                    [a / drafts for a in counters.accepted_per_position] if drafts else [],
                    speed, counters.draft_tokens / drafts if drafts else None)


def poll(client: LlamaClient, timeout: float, before: dict[int, int], seconds: float | None) -> list[SlotLine]:
    slots = read_slots(client, timeout)
    counters = read_counters(client, timeout)
    return [slot_line(s, counters, before.get(s["id"]), seconds) for s in slots]


def report(lines: list[SlotLine], url: str) -> dict[str, Any]:
    return {"url": url, "slots": [asdict(line) for line in lines]}


def watch(url: str, interval: float, once: bool, as_json: bool, timeout: float, out: TextIO = sys.stdout,
          api_key: str | None = None) -> None:
    """Poll until KeyboardInterrupt (the caller's Ctrl-C), or once."""
    client = LlamaClient(checked_url(url), timeout=timeout, api_key=api_key)
    live = out.isatty() and not as_json
    shown, before, last = 0, {}, None
    while True:
        now = time.monotonic()
        lines = poll(client, timeout, before, now - last if last is not None else None)
        before, last = {s.id: s.n_decoded for s in lines if s.n_decoded is not None}, now
        if as_json:
            out.write(json.dumps(report(lines, client.url), ensure_ascii=False) + "\n")
        elif live:  # rewrite the lines written last time, in place
            out.write((f"\x1b[{shown}F" if shown else "") + "".join(f"\x1b[2K{s.text()}\n" for s in lines))
            shown = len(lines)
        else:
            out.write("".join(f"{time.strftime('%H:%M:%S')} {s.text()}\n" for s in lines))
        out.flush()
        if once:
            return
        time.sleep(max(0.0, interval - (time.monotonic() - now)))


@click.command("watch")
@click.argument("url")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="Seconds between two readings.")
@click.option("--once", is_flag=True, help="Read once, print, exit (for scripts; with --json, one object).")
@json_option
@click.option("--timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="Seconds to wait for each answer (and for a --url server to respond at all).")
@click.option("--api-key", envvar="LLAMA_API_KEY", default=None,
              help="The server's --api-key, sent as a bearer token (env LLAMA_API_KEY).")
def watch_command(url: str, interval: float, once: bool, as_json: bool, timeout: float, api_key: str | None) -> None:
    """Show a running llama-server's speculative decoding live: one line per slot with tau,
    acceptance by draft depth, tokens per second and the draft length in use, every
    --interval seconds until Ctrl-C (exit 0).

    \b
    URL is the server's address, as `dflash-gguf serve` prints it; the server needs
    --metrics (serve starts it so). On a terminal the lines are rewritten in place; into a
    pipe or file each reading is new lines. --json prints one object per reading
    ({"url", "slots": [{"id", "processing", "tau", "acceptance", "acceptance_by_depth",
    "tokens_per_second", "draft_length", "draft_tokens", "accepted_tokens", "drafts",
    "scope"}]}); "scope" is "server" when the counters are the server's for all slots
    together (llama-server's /metrics), "slot" when the server gives each slot its own.

    \b
    Exit status 0 (Ctrl-C, or --once), 1 when nothing answers at URL, 2 when what answers
    is not llama-server or sends what llama-server does not (HTML, invalid JSON, a body
    over 4 MiB, a metric that is not a number).

    \b
    Examples:
      dflash-gguf watch http://127.0.0.1:8080
      dflash-gguf watch http://127.0.0.1:8080 --once --json | jq '.slots[0].tau'
    """
    try:
        watch(url, interval, once, as_json, timeout, api_key=api_key)
    except KeyboardInterrupt:
        return


commands = [watch_command]
