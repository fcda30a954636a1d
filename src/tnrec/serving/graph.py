"""Loading an export's dense graph."""

from __future__ import annotations

import io
import os
from typing import Any

import torch

from tnrec import _fileio
from tnrec.errors import CheckpointError
from tnrec.export.dictionary import check_present


def load_graph(fname: str) -> FlatGraph:
    """The ``torch.export`` program of ``fname``, as the Predictor calls it (a damaged file
    named)."""
    return FlatGraph(load_program(fname))


class FlatGraph:
    """An exported program called on its flat tensor arguments, as the Predictor calls it.

    ``program.module()`` flattens its arguments with pytree and checks them
    against the program's input constraints on every call: for DeepFM at batch
    1 a call takes 0.42 ms that way and 0.16 ms directly (``python
    bench/serve_bench.py``, 2-core machine). The Predictor builds the same
    arguments for every call (the manifest's shapes, only the batch varies,
    and it is at least 1). So the first call goes through the checked module
    (:attr:`module`) and also runs the program's graph directly, with its
    lifted parameters, buffers and constants before the arguments; when the
    two answers are the same tensors, bit for bit, the later calls run the
    graph directly. A program whose graph takes a lifted input after an
    argument, writes one of its inputs (a buffer updated in place, or returned
    as an extra output), or whose two answers differ, keeps running the
    checked module. After the first call, arguments are not checked.
    Called under ``torch.no_grad()``.
    """

    def __init__(self, program: torch.export.ExportedProgram) -> None:
        from torch.export.graph_signature import InputKind, OutputKind

        #: The program as a module (``program.module()``): checks every call's arguments.
        self.module = program.module()
        self._graph = program.graph_module
        self._lifted: list[Any] = []
        users = 0
        sig = program.graph_signature
        self._direct: bool | None = None  # None: not decided before the first call
        if not all(o.kind == OutputKind.USER_OUTPUT for o in sig.output_specs) or _writes_an_input(
            program.graph_module
        ):
            self._direct = False
        for spec in sig.input_specs:
            if spec.kind == InputKind.USER_INPUT:
                users += 1
            elif users:  # a lifted input after an argument
                self._direct = False
            elif spec.kind == InputKind.PARAMETER or (
                spec.kind == InputKind.BUFFER and spec.persistent
            ):
                self._lifted.append(program.state_dict[spec.target])
            else:  # a non-persistent buffer, a constant tensor or object
                self._lifted.append(program.constants[spec.target])

    def __call__(self, *args: torch.Tensor) -> Any:
        if self._direct:
            return self._graph(*self._lifted, *args)
        out = self.module(*args)
        if self._direct is None:
            self._direct = _same_tensors(out, lambda: self._graph(*self._lifted, *args))
        return out


def _writes_an_input(graph: torch.fx.GraphModule) -> bool:
    """Whether an op of ``graph`` writes in place into one of its inputs (a parameter, a
    buffer, a constant or an argument), directly or through a view of it. Writes into
    the graph's own intermediate tensors (``ReLU(inplace=True)``) do not count."""
    for node in graph.graph.nodes:
        schema = _schema(node)
        if schema is None or not schema.is_mutable:
            continue
        for value, arg in _args(node, schema):
            if arg.alias_info is not None and arg.alias_info.is_write and _aliases_input(value):
                return True
    return False


def _schema(node: torch.fx.Node) -> Any:
    return getattr(node.target, "_schema", None) if node.op == "call_function" else None


def _args(node: torch.fx.Node, schema: Any) -> list[tuple[Any, Any]]:
    """``(value, schema argument)`` of each argument ``node`` passes."""
    out = []
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args):
            out.append((node.args[i], arg))
        elif arg.name in node.kwargs:
            out.append((node.kwargs[arg.name], arg))
    return out


def _aliases_input(value: Any) -> bool:
    """Whether ``value`` (a node, or a list of them) may share memory with an input of its
    graph: a placeholder, a module attribute, or a view or in-place result of one."""
    if isinstance(value, (list, tuple)):
        return any(_aliases_input(v) for v in value)
    if not isinstance(value, torch.fx.Node):
        return False
    if value.op in ("placeholder", "get_attr"):
        return True
    schema = _schema(value)
    if schema is None:  # getitem of a multi-output op, or another callable: follow its inputs
        return any(_aliases_input(v) for v in (*value.args, *value.kwargs.values()))
    if all(r.alias_info is None for r in schema.returns):
        return False  # a new tensor
    return any(_aliases_input(v) for v, arg in _args(value, schema) if arg.alias_info is not None)


def _same_tensors(out: Any, direct: Any) -> bool:
    """Whether ``out`` is a tuple or list of tensors and ``direct()`` returns the same ones,
    bit for bit."""
    if not isinstance(out, (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in out):
        return False
    try:
        got = direct()
    except Exception:  # the graph does not take its arguments this way: keep the module
        return False
    return (
        isinstance(got, (tuple, list))
        and len(got) == len(out)
        and all(
            isinstance(g, torch.Tensor) and torch.equal(g, t) for g, t in zip(got, out, strict=True)
        )
    )


def load_program(fname: str) -> Any:
    """The ``torch.export`` program of ``fname`` (local or remote; a damaged file named).

    Raises:
        CheckpointError: the file is missing or damaged.
    """
    check_present(fname)
    try:
        if _fileio.is_remote(fname):
            return torch.export.load(io.BytesIO(_fileio.read_bytes(fname)))
        return torch.export.load(fname)
    except Exception as e:  # torch raises many types on a damaged archive; name the file
        raise CheckpointError(
            f"Export file {fname} is damaged (torch.export.load fails: {e}); write the export anew."
        ) from None


#: Where compiled dense graphs are kept unless a directory is given.
AOT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "tnrec", "aot")


def aot_graph(
    fname: str, cache_dir: str | os.PathLike[str] | None = None
) -> tuple[Any | None, str | None]:
    """The dense graph of ``fname`` compiled ahead of time (``torch._inductor`` AOT package),
    or ``(None, why)`` when it cannot be: return ``(module, None)`` on success.

    The package is kept in ``cache_dir`` (default ``~/.cache/tnrec/aot``) under
    the graph file's sha256 and the torch version, so a restart with the same
    export loads it in milliseconds instead of compiling again (a minute or
    more for a zoo model on two cores). Compiling needs a C++ compiler; a
    package that does not load (damaged, another torch) is compiled anew. The
    module takes the same flat arguments as the exported program and returns
    the heads' outputs as a list.
    """
    import hashlib
    import tempfile

    if _fileio.is_remote(fname):
        return None, f"{fname} is not a local file"
    with open(fname, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()[:32]
    cache = os.fspath(cache_dir or AOT_CACHE)
    package = os.path.join(cache, f"{digest}-torch{torch.__version__}.pt2".replace("+", "_"))
    if os.path.exists(package):
        try:
            return torch._inductor.aoti_load_package(package), None
        except Exception:  # a damaged or foreign package: compile it anew below
            os.remove(package)
    try:
        os.makedirs(cache, exist_ok=True)
        program = torch.export.load(fname)
        fd, tmp = tempfile.mkstemp(suffix=".pt2", dir=cache)
        os.close(fd)
        try:
            torch._inductor.aoti_compile_and_package(program, package_path=tmp)
            os.replace(tmp, package)  # whole or not at all
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return torch._inductor.aoti_load_package(package), None
    except Exception as e:  # no compiler, an unsupported op, a full disk: say why
        first = (str(e).strip().splitlines() or [""])[0]
        return None, f"{type(e).__name__}: {first[:300]}"
