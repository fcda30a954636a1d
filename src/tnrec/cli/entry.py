"""The ``tnrec`` argument parser and its dispatch to the commands."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tnrec import _fileio, checkpoint
from tnrec.cli.common import current_or_new_strategy, number_arg, to_json
from tnrec.cli.config import load_config
from tnrec.cli.demo import demo
from tnrec.cli.inspection import inspect
from tnrec.cli.run import evaluate, export, part_path, predict, write_latest
from tnrec.cli.train import train
from tnrec.distribute import current_strategy
from tnrec.errors import ArgumentError, TnrecError


def _parser() -> argparse.ArgumentParser:
    positive_int = number_arg(int, 1)
    timeout = number_arg(float, 0, above=True)
    p = argparse.ArgumentParser(prog="tnrec", description="tnrec: train and run zoo models.")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="synthetic data -> DeepFM -> test AUC vs optimal AUC")
    d.add_argument("--rows", type=positive_int, default=300_000, help="training rows (>= 1)")
    d.add_argument("--epochs", type=positive_int, default=1, help="passes (>= 1)")
    d.add_argument("--output-dir", help="keep data and run here (default: a temp dir)")
    d.add_argument("--seed", type=number_arg(int, 0), default=0, help="(>= 0)")
    t = sub.add_parser("train", help="train the days of a TOML run config, a checkpoint a day")
    t.add_argument("--config", required=True, help="the run.toml")
    t.add_argument("--output-dir", help="override output_dir of the config")
    t.add_argument(
        "--eval-next-day", action="store_true", help="AUC on each day before training on it"
    )
    t.add_argument("--timeout-s", type=timeout, help="override distributed.timeout_s (> 0)")
    t.add_argument("--device", help="override train.device: cpu | cuda | cuda:N (the dense part)")
    for name in ("evaluate", "predict"):
        e = sub.add_parser(name, help=f"{name} with a model written by `tnrec train`")
        e.add_argument("--model-dir", required=True, help="the model dir (or output_dir)")
        e.add_argument("--data", nargs="+", help="input files/globs (default: the config's test)")
        e.add_argument(
            "--timeout-s", type=timeout, help="collective timeout (default: the run config's)"
        )
        if name == "predict":
            e.add_argument("--output", required=True, help="predictions file (.parquet or .csv)")
            e.add_argument("--format", choices=("parquet", "csv"))
            e.add_argument(
                "--merge", action="store_true", help="under torchrun: rank 0 merges the parts"
            )
    x = sub.add_parser("export", help="inference export (or delta export) of a checkpoint")
    x.add_argument("--model-dir", required=True)
    x.add_argument("--out", required=True, help="a new directory")
    x.add_argument("--dt", help="the last checkpoint of this day (default: the published one)")
    x.add_argument(
        "--min-show", type=number_arg(float, 0), help="drop rows whose show is below this (>= 0)"
    )
    x.add_argument("--onnx", action="store_true", help="also write dense.onnx (needs onnx)")
    x.add_argument(
        "--latest",
        action="store_true",
        help="then make <parent of --out>/_latest name it (what `tnrec serve --watch` serves)",
    )
    x.add_argument(
        "--format",
        choices=("npy", "tsv"),
        default="npy",
        help="tsv: also TensorNet merge_sparse-style text dictionaries, tsv/<table>/<shard>.tsv",
    )
    x.add_argument("--delta", action="store_true", help="rows updated/deleted --since --to")
    x.add_argument("--since", help="delta: the day of the full export it applies to")
    x.add_argument("--to", help="delta: the day it brings the export to")
    x.add_argument(
        "--allow-incomplete",
        action="store_true",
        help="export a day whose last checkpoint was saved mid-day",
    )
    c = sub.add_parser("checkpoint", help="checkpoint maintenance: publish a generation")
    csub = c.add_subparsers(dest="action", required=True)
    cp = csub.add_parser(
        "publish", help="make MODEL_DIR/DT/GEN the current checkpoint (rewrite _checkpoint)"
    )
    cp.add_argument("path", metavar="MODEL_DIR/DT/GEN")
    _serve_parser(sub)
    _import_parser(sub)
    i = sub.add_parser("inspect", help="days, generations, tables of a model dir; one row")
    i.add_argument("path", metavar="MODEL_DIR[/DT]")
    i.add_argument("--table")
    i.add_argument("--key", help="a hashed key (int)")
    i.add_argument("--json", action="store_true", help="print JSON")
    return p


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    positive_int = number_arg(int, 1)
    v = sub.add_parser("serve", help="an HTTP prediction service over an export")
    v.add_argument("export", metavar="EXPORT", help="the export directory (or URI) to serve")
    v.add_argument("--host", default="127.0.0.1")
    v.add_argument("--port", type=number_arg(int, 0), default=8500, help="(0: any free port)")
    v.add_argument("--workers", type=positive_int, default=1, help="worker processes (>= 1)")
    v.add_argument(
        "--max-batch", type=positive_int, default=256, help="rows merged into one call (>= 1)"
    )
    v.add_argument(
        "--max-wait-ms",
        type=number_arg(float, 0),
        default=0.0,
        help="how long a batch waits for more requests (>= 0; 0: it takes what queued meanwhile)",
    )
    v.add_argument(
        "--inline-rows",
        type=number_arg(int, 0),
        default=16,
        help="a batch of at most this many rows runs on the event loop, not the predict thread "
        "(>= 0; 0: every batch on the thread)",
    )
    v.add_argument(
        "--max-rows", type=positive_int, default=10_000, help="rows a request may hold (>= 1)"
    )
    v.add_argument("--watch", metavar="DIR", help="serve the export DIR/_latest names, reloading")
    v.add_argument(
        "--threads", type=positive_int, default=1, help="torch threads per worker (>= 1)"
    )
    v.add_argument(
        "--aot",
        action="store_true",
        help="run the dense graph compiled ahead of time (needs a C++ compiler the first time; "
        "without one the exported program runs and /readyz says why)",
    )
    v.add_argument(
        "--aot-cache", metavar="DIR", help="where --aot keeps compiled graphs (~/.cache/tnrec/aot)"
    )


def _import_parser(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser(
        "import-tensornet", help="a TensorNet checkpoint's sparse tables as a tnrec checkpoint"
    )
    m.add_argument("src", metavar="SRC", help="TensorNet's save_weights filepath (or its day)")
    m.add_argument("dst", metavar="DST", help="a new tnrec model dir")
    m.add_argument("--dt", help="the day to read (default: the one SRC/_checkpoint names)")
    m.add_argument(
        "--optimizer", choices=("AdaGrad", "Adam", "Ftrl"), help="what bin block files hold"
    )
    m.add_argument("--cvm", action="store_true", help="bin AdaGrad files carry a click")


def import_tensornet(args: argparse.Namespace) -> None:
    """``tnrec import-tensornet``: import, then print what was and was not imported."""
    from tnrec.compat.tensornet_import import import_checkpoint

    report = import_checkpoint(
        args.src, args.dst, dt=args.dt, optimizer=args.optimizer, cvm=args.cvm
    )
    print(f"wrote {report.path} (day {report.dt})")
    for name, t in report.tables.items():
        print(
            f'table "{name}": {t["rows"]} rows, {t["optimizer"]}, dim {t["dim"]}, from '
            f"{t['files']} files of {t['ranks']} ranks"
        )
    for line in report.not_imported:
        print(line)


def _run(args: argparse.Namespace) -> None:
    if args.command == "demo":
        demo(args.rows, args.epochs, args.output_dir, args.seed)
    elif args.command == "train":
        cfg = load_config(args.config, output_dir=args.output_dir)
        if args.timeout_s is not None:
            cfg.distributed.timeout_s = args.timeout_s
        if args.device is not None:  # checked by train, as the config's value is
            cfg.train.device = args.device
        logs = train(cfg, eval_next_day=args.eval_next_day)
        if current_or_new_strategy().rank == 0:
            print(to_json({k: v for k, v in logs.items() if k != "days"}))
    elif args.command == "evaluate":
        logs = evaluate(args.model_dir, args.data, verbose=0, timeout_s=args.timeout_s)
        if current_or_new_strategy().rank == 0:
            print(to_json(logs))
    elif args.command == "predict":
        n = predict(args.model_dir, args.output, args.data, args.format, args.merge, args.timeout_s)
        s = current_or_new_strategy()
        if s.rank == 0:
            where = args.output
            if s.world_size > 1 and not args.merge:
                kind = args.format or ("csv" if where.lower().endswith(".csv") else "parquet")
                where = part_path(where, 0, s.world_size, kind).replace(".part-0-", ".part-*-")
            print(f"wrote {n} predictions to {where}")
    elif args.command == "export":
        if args.format == "tsv" and args.delta:
            raise ArgumentError("--format tsv writes full exports' dictionaries, not deltas.")
        out = export(
            args.model_dir,
            args.out,
            dt=args.dt,
            min_show=args.min_show,
            delta=args.delta,
            since=args.since,
            to=args.to,
            onnx=args.onnx,
            allow_incomplete=args.allow_incomplete,
        )
        if current_or_new_strategy().rank == 0:
            print(f"wrote {'the delta' if args.delta else 'the export'} to {out}")
            if args.format == "tsv":  # rank 0, once the manifest is there: every shard
                from tnrec.export.tsv import write_tsv

                print(f"wrote {len(write_tsv(out))} text dictionaries to {out}/tsv")
            if args.latest:
                print(f"{write_latest(out)} now names it")
    elif args.command == "serve":
        serve(args)
    elif args.command == "import-tensornet":
        import_tensornet(args)
    elif args.command == "inspect":
        print(inspect(args.path, args.table, args.key, args.json))
    elif args.command == "checkpoint":
        pointer = checkpoint.publish(args.path)
        print(f"{pointer} now names {_fileio.absolute(args.path)}")


def serve(args: argparse.Namespace) -> None:
    """``tnrec serve``: check the export, then run the service until interrupted.

    Raises:
        ArgumentError: the ``tnrec[serve]`` extra is not installed.
        CheckpointError: no intact export at ``args.export``.
    """
    try:
        from tnrec.serve import Settings
        from tnrec.serve import serve as run_service
    except ImportError as e:
        raise ArgumentError(
            f"tnrec serve needs the serve extra ({e}): pip install 'tnrec[serve]'."
        ) from None
    from tnrec.export import read_manifest

    read_manifest(args.export)  # a clear error before any worker starts
    settings = Settings(
        export=_fileio.absolute(args.export),
        max_batch=args.max_batch,
        max_wait_ms=args.max_wait_ms,
        inline_rows=args.inline_rows,
        max_rows=args.max_rows,
        watch=_fileio.absolute(args.watch) if args.watch else None,
        threads=args.threads,
        aot=args.aot,
        aot_cache=_fileio.absolute(args.aot_cache) if args.aot_cache else None,
    )
    run_service(settings, host=args.host, port=args.port, workers=args.workers)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``tnrec`` command line; return the exit status.

    0 on success (and ``--help``); 2 for a user error: a bad flag (argparse's
    usage error) or a :class:`~tnrec.errors.TnrecError`, printed as one line
    ``tnrec <command>: error: ...``; 1 for any other ``OSError``, printed
    with its path.
    """
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # argparse has printed the usage error or the help
        return e.code if isinstance(e.code, int) else 2
    try:
        _run(args)
    except TnrecError as e:
        print(f"tnrec {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        where = f": {e.filename}" if e.filename else ""
        print(f"tnrec {args.command}: error: {e.strerror or e}{where}", file=sys.stderr)
        return 1
    finally:
        s = current_strategy()
        if s is not None and s.is_distributed:
            s.shutdown()
    return 0
