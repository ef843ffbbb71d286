"""The doctor on a script run by several processes (DistributedDataParallel): `gantools doctor --nproc N SCRIPT.py`
starts N processes itself, as torchrun would (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT in each one's
environment: the script's `init_process_group()` finds them), each running `gantools doctor SCRIPT.py` under them;
`torchrun --nproc_per_node N -m gantools doctor SCRIPT.py` does the same through torchrun.

In each process the usual single-process diagnosis runs (`script.run_script`), with `ddp.DDPWatch` beside it; each
writes what it saw to a file in a folder all processes of one launch name alike (their parent's pid and the master
port), and rank 0 waits for the others' files, adds what only several processes show (`findings.ddp`) to its own report
and prints it. A process that fails writes why, so rank 0 says which rank and why in one line; `--nproc` also ends
the other processes when one fails, since they would wait for it in the next all-reduce."""
from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ...core import distributed
from ...errors import DoctorError, GantoolsError, ScriptError

GATHER_S = 120.0  # how long rank 0 waits for the other processes' results after its own
GRACE_S = 5.0     # how long --nproc lets the other processes go on after one failed, before ending them


def gather_dir() -> Path:
    """The folder the processes of one launch share: named by their common parent (torchrun's agent, or `--nproc`'s
    process) and the master port."""
    port = os.environ.get("MASTER_PORT", "0")
    return Path(tempfile.gettempdir()) / f"gantools-doctor-{os.getppid()}-{port}"


def check_world(where: distributed.World) -> None:
    """One machine only: the processes hand their results over through files."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", where.size))
    if local != where.size:
        raise DoctorError(f"rank {where.rank}: the doctor gathers its {where.size} processes on one machine, and "
                          f"this one runs {local} of them: diagnose on one node (gantools doctor --nproc N, or "
                          "torchrun --nnodes 1)")


def run_rank(path, args, steps: int, warmup: int, trace, timeout):
    """This process's part: the script diagnosed under the DDP watch; its result (or the error that ended it)
    written for rank 0. Returns (rank 0's merged report, or None on another rank). Raises on rank 0 what any rank
    raised, naming it."""
    from ..watching.ddp import DDPWatch, rank_facts
    from .script import run_script

    where = distributed.world()
    check_world(where)
    folder = gather_dir()
    folder.mkdir(parents=True, exist_ok=True)
    if where.rank and trace:
        trace = Path(trace).with_name(f"{Path(trace).stem}-rank{where.rank}{Path(trace).suffix}")
    seen = {}
    try:
        with DDPWatch() as watch:
            report = run_script(path, args, steps, warmup, trace, timeout,
                                on_close=lambda doc: seen.update(facts=rank_facts(watch, doc)))
        result = {"report": report, "facts": seen.get("facts", {}), "error": None}
    except GantoolsError as e:
        result = {"report": getattr(e, "report", None), "facts": seen.get("facts", {}), "error": _error(e)}
    finally:
        distributed.shutdown()
    _write(folder / f"rank{where.rank}.pkl", result)
    if result["error"]:  # said now: the others may wait for this process in a collective
        raise _raised(where.rank, result["error"])
    if where.rank:
        return None
    return _merge(result, _gather(folder, where.size), where.size)


def _error(e: GantoolsError) -> dict:
    return {"message": str(e), "traceback": getattr(e, "traceback_text", None)}


def _raised(rank: int, error: dict) -> DoctorError:
    if error["traceback"]:
        return ScriptError(f"rank {rank}: {error['message']}", error["traceback"])
    return DoctorError(f"rank {rank}: {error['message']}")


def _write(path: Path, result: dict) -> None:
    tmp = path.with_suffix(".partial")
    try:
        data = pickle.dumps(result)
    except (pickle.PicklingError, TypeError, AttributeError):  # a report holding something of the script's
        data = pickle.dumps({**result, "report": None})
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _gather(folder: Path, size: int) -> list:
    """The other processes' results, in rank order, waiting up to GATHER_S for them."""
    deadline, out = time.monotonic() + GATHER_S, []
    for rank in range(1, size):
        path = folder / f"rank{rank}.pkl"
        while not path.is_file():
            if time.monotonic() > deadline:
                raise DoctorError(f"rank {rank} sent no result within {GATHER_S:g} s of rank 0's: did it fail? "
                                  "(its own output says why)")
            time.sleep(0.05)
        out.append(pickle.loads(path.read_bytes()))
        path.unlink()
    (folder / "rank0.pkl").unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:
        pass
    return out


def _merge(own: dict, others: list, size: int):
    """Rank 0's report with what all processes showed: the `ddp` settings and the findings of `findings.ddp`."""
    from ..findings.ddp import ddp_findings

    for rank, result in enumerate(others, 1):
        if result["error"]:
            raise _raised(rank, result["error"])
    report = own["report"]
    if not report.complete:
        return report
    facts = own["facts"]
    ddp = {**facts, "world_size": size,
           "step_ms": [r["report"].step_time_ms if r["report"] else float("nan") for r in [own, *others]],
           "samplers": [[x["sampler"] for x in r["facts"].get("loaders", [])] for r in [own, *others]],
           "same_batches": _same_batches(facts.get("fingerprints", []),
                                         [r["facts"].get("fingerprints", []) for r in others])}
    report.settings["ddp"] = ddp
    extra = ddp_findings(report)
    report.findings = sorted(report.findings + extra, key=lambda f: -(f.estimated_speedup or 0.0))
    return report


def _same_batches(mine: list, theirs: list) -> list:
    """For each other rank: (batches identical to rank 0's, batches compared) over the first batches drawn."""
    out = []
    for other in theirs:
        pairs = [(a, b) for a, b in zip(mine, other, strict=False) if a is not None and b is not None]
        out.append([sum(a == b for a, b in pairs), len(pairs)])
    return out


# -- --nproc: the processes started here --------------------------------------------------------------------------

def launch(argv: list, nproc: int) -> int:
    """Start `nproc` processes of `python -m gantools doctor ARGV...` as torchrun would, rank 0's output shown, the
    others' kept and shown when they fail; returns the exit status (rank 0's, else the first failed rank's)."""
    if distributed.world().distributed:
        raise DoctorError("--nproc starts the processes itself: run it without torchrun (or give torchrun "
                          "--nproc_per_node and no --nproc)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(nproc),
            "LOCAL_WORLD_SIZE": str(nproc)}
    logs, procs = [], []
    for rank in range(nproc):
        env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        log = None if rank == 0 else tempfile.TemporaryFile()
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, "-m", "gantools", "doctor", *argv], env=env,
                                      stdout=log if log else None, stderr=subprocess.STDOUT if log else None))
    try:
        codes, first = _wait(procs)
    except KeyboardInterrupt:  # the terminal's Ctrl-C reached every process: each reports what it saw
        codes, first = _wait(procs)
    failed = [first] if first is not None else []
    for rank in failed[:1]:
        if rank and logs[rank] is not None:
            logs[rank].seek(0)
            text = logs[rank].read().decode(errors="replace").strip()
            print(f"gantools doctor: rank {rank} ended with status {codes[rank]}:\n{text[-4000:]}", file=sys.stderr)
    for log in logs:
        if log is not None:
            log.close()
    return codes[first] if first is not None else 0


def _wait(procs: list) -> tuple[list, int | None]:
    """Wait for every process; once one has failed, give the others GRACE_S, then end them. Returns the exit
    statuses and the rank that failed first (None when none did)."""
    failed_at = first = None
    while any(p.poll() is None for p in procs):
        if failed_at is None:
            first = next((r for r, p in enumerate(procs) if p.poll() not in (None, 0)), None)
            failed_at = time.monotonic() if first is not None else None
        if failed_at is not None and time.monotonic() - failed_at > GRACE_S:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                p.wait()
            break
        time.sleep(0.05)
    if first is None:
        first = next((r for r, p in enumerate(procs) if p.returncode != 0), None)
    return [p.returncode for p in procs], first


# -- the command line ---------------------------------------------------------------------------------------------

def main(args: dict, argv: list) -> int:
    """`gantools doctor` for a script of several processes: with --nproc, start them; in one of them (started by
    --nproc or torchrun), diagnose, and on rank 0 print the report. A failed rank says so itself, in one line (its
    script's traceback before it, when the script raised)."""
    if args["try_fixes"] or args["patch"] or args["fid"]:
        raise DoctorError("--try, --patch and --fid measure fixes in one process: with several, read the findings "
                          "and measure a change by running the doctor before and after it")
    if args["nproc"]:
        return launch(argv, args["nproc"])
    try:
        report = run_rank(args["script"], args["args"], args["steps"], args["warmup"], args["trace"],
                          args["timeout"])
    except ScriptError as e:
        print(f"gantools doctor: your script raised:\n{e.traceback_text}gantools doctor: {e}", file=sys.stderr)
        return 2
    except GantoolsError as e:
        print(f"gantools doctor: {e}", file=sys.stderr)
        return 2
    if report is None:  # another rank: rank 0 reports
        return 0
    print(report)
    if args["json"]:
        print(f"JSON: {report.save_json(args['json'])}")
    if not report.complete:
        print(f"gantools doctor: {report.note}", file=sys.stderr)
        return 130 if report.settings.get("outcome") == "interrupted" else 2
    return 0
