"""Annular updating as a plain DDP communication hook: top-k selection with memory, summed on a ring.

    from ringps.hooks import RingTopkState, ring_topk_hook
    ddp.register_comm_hook(RingTopkState(density=0.01), ring_topk_hook)

Per bucket, on one communication thread (so every rank issues the same collectives in the same
order, and the backward pass goes on meanwhile):
  - large tensors: compensate with the memory, select k = density * numel entries per tensor,
    sum the selections over the ring with the bucket's exchange, keep the rest in the memory;
  - small tensors (biases, small conv kernels): deferred, and all-reduced dense in one fused
    message with the last bucket (one latency per step instead of one per tensor).
The exchange is the cost model's choice per bucket ("auto"), or forced (`exchange=`); in the run's
last `exact_tail` of its `total_steps` shared-index gives way to every rank's own top k. Every rank
applies the same averaged update, so replicas stay bitwise identical. memory_units="update" keeps
what the memory holds back in units of the update (Mem-SGD), rescaled when the optimizer's lr moves.
"""

from __future__ import annotations

import atexit
import logging
import statistics
import time
from typing import Any, Optional

import torch
import torch.distributed as dist

from ringps import trace
from ringps.comm.exchanges import (
    EXCHANGES,
    VALUE_DTYPES,
    Exchange,
    Segment,
    build_exchange,
    choose_exchange,
    faithful_candidates,
    tail_start,
)
from ringps.comm.meter import PayloadMeter
from ringps.comm.p2p import Ring
from ringps.comm.thread import CommThread
from ringps.compress import MEMORIES, SELECTORS, DensitySchedule
from ringps.cost import CostParams
from ringps.hooks.ring_topk_bucket import BucketWork

log = logging.getLogger("ringps")
if not log.handlers and not logging.getLogger().handlers:  # say it even where nobody set up logging
    log.addHandler(logging.StreamHandler())
    log.setLevel(logging.INFO)


class RingTopkState(BucketWork):
    """Hyper-parameters, per-tensor memory (keyed by parameter name) and statistics."""

    def __init__(
        self,
        density: float = 0.01,
        process_group: Optional[dist.ProcessGroup] = None,
        warmup_steps: int = 0,
        selector: str = "auto",
        memory: str = "ef",
        exchange: str = "auto",
        dense_below: int = 1 << 17,
        block: int = 256,
        momentum: float = 0.9,
        clip_norm: float = 0.0,
        memory_units: str = "gradient",
        seed: int = 0,
        timeout: float = 300.0,
        cost: Optional[CostParams] = None,
        progress: Optional[float] = None,
        compute_s: Optional[float] = None,
        value_dtype: str = "fp32",
        total_steps: Optional[int] = None,
        exact_tail: float = 0.0,
    ):
        if not 0.0 <= density <= 1.0:
            raise ValueError(f"density {density}: must be in [0, 1]")
        if progress is not None and not 0.0 < progress <= 1.0:
            raise ValueError(f"progress {progress}: must be in (0, 1]")
        if exchange != "auto":
            EXCHANGES.get(exchange)
        if value_dtype not in VALUE_DTYPES:
            raise ValueError(f"value_dtype {value_dtype!r}: one of {', '.join(VALUE_DTYPES)}")
        if not 0.0 <= exact_tail < 1.0:
            raise ValueError(f"exact_tail {exact_tail}: a fraction of the run's steps, in [0, 1)")
        if memory_units not in ("update", "gradient"):
            raise ValueError(f"memory_units {memory_units!r}: update or gradient")
        self.value_dtype, self.memory_units = value_dtype, memory_units
        # hyper-parameters
        self.process_group = process_group
        self.schedule = DensitySchedule(density, warmup_steps)
        self.exchange_name, self.dense_below, self.block = exchange, dense_below, block
        self.timeout, self.seed = timeout, seed
        self.selector = SELECTORS.build(selector, seed=seed) if selector in ("threshold", "randomk", "auto") else SELECTORS.build(selector)
        # the world size is read at first use (a framework may build this before the process group)
        self.memory = MEMORIES.build(memory, momentum=momentum, clip_norm=clip_norm, workers=1)
        self.cost: Optional[CostParams] = cost  # None: measured on the job's own links at first use
        # auto's price of sparse updates: the progress a sparse step makes relative to a dense
        # one, and the step's compute (seconds; its share per bucket goes into the comparison)
        self.progress, self.compute_s = progress, compute_s  # compute_s None: measured over the first steps
        # the run's last exact_tail of its total_steps: no exchange less faithful than the most
        # faithful sparse one (shared-index's common blocks give way to every rank's own top k)
        self.exact_tail, self.tail_from = exact_tail, None
        self.set_total_steps(total_steps)
        self.model_numel = 0
        # internal state
        self.iteration = 0
        self.names: dict[int, str] = {}  # id(param) -> name, for memory keys and checkpoints
        self.groups: dict[int, dict] = {}  # id(param) -> its optimizer param group (the live lr)
        self.memory_lr: dict[str, float] = {}  # name -> the lr its memory is in units of
        self.overlap: dict[int, float] = {}  # id(param) -> backward seconds left once its grad is ready
        self.plans: dict[tuple, str] = {}  # (bucket signature, k, in the exact tail) -> exchange name
        self.exchanges: dict[str, Exchange] = {}  # name -> the exchange (state kept per tensor, e.g. block scores)
        # per bucket of the step still open: its future, buffer, deferred small tensors, and the
        # future of its all-reduce where one is still in flight (a dense bucket, see dense_bucket)
        self.deferred: list[tuple[torch.futures.Future, torch.Tensor, list, Optional[torch.futures.Future]]] = []
        self._flat: dict[tuple, tuple[torch.Tensor, Optional[torch.Tensor]]] = {}
        self._ring: Optional[Ring] = None
        self._thread: Optional[CommThread] = None
        # statistics
        self.meter = PayloadMeter()
        self.chosen: dict[str, int] = {}
        # bucket signature -> (choice, costs, overlap seconds it weighed) at the final density
        self.decisions: dict[tuple, tuple[str, dict, float]] = {}
        self._ready = False
        self.device = torch.device("cpu")  # the gradients' device, known at first use
        self._steps: list[float] = []  # per measured step: its compute (step_done)
        self._step_end = 0.0

    def set_total_steps(self, total_steps: Optional[int]) -> None:
        """The run's length in steps, where the exact tail begins (None: unknown, no tail); for a
        framework that knows it only once training starts (Lightning's estimated_stepping_batches)."""
        self.tail_from = tail_start(total_steps, self.exact_tail)

    @classmethod
    def from_config(cls, cfg, steps_per_epoch: int, process_group=None, timeout: float = 300.0,
                    **overrides: Any) -> "RingTopkState":
        """The state `ringps train` runs: the config's compress section (density, warm-up in epochs,
        selector, memory, exchange, ...), its momentum and seed; `overrides` replace any of them."""
        c = cfg.compress
        kw = dict(density=c.density, warmup_steps=int(round(c.density_warmup_epochs * steps_per_epoch)),
                  selector=c.selector, memory=c.memory, exchange=c.exchange, dense_below=c.dense_below, block=c.block,
                  momentum=cfg.train.momentum, clip_norm=c.clip_norm, seed=cfg.run.seed, progress=c.sparse_progress,
                  value_dtype=c.value_dtype, memory_units=c.memory_units, exact_tail=c.exact_tail,
                  total_steps=cfg.train.steps or cfg.train.epochs * steps_per_epoch)
        return cls(process_group=process_group, timeout=timeout, **{**kw, **overrides})

    # -- set-up --------------------------------------------------------------------------
    def bind(self, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None) -> "RingTopkState":
        """Key memories by parameter name (stable across DDP's bucket rebuild and checkpoints).
        Takes the model or its DDP wrapper; without it the names are found at first use. The
        optimizer gives each tensor's learning rate (memory_units="update"); without it the
        optimizer that holds the parameters is found at first use."""
        model = getattr(model, "module", model)  # DDP -> the user's module: names without "module."
        self.names = {id(p): n for n, p in model.named_parameters()}
        self.model_numel = sum(p.numel() for p in model.parameters())
        if optimizer is not None:
            self.groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
        return self

    @staticmethod
    def _owner(params: list[torch.Tensor], kind: type, params_of) -> Any:
        """The first live object of `kind` whose `params_of(obj)` holds one of these parameters
        (bind() was not called, or this state was pickled into another process, where parameter
        ids mean nothing); None if there is none."""
        import gc

        ids = {id(p) for p in params}
        return next((o for o in gc.get_objects() if isinstance(o, kind) and any(id(p) in ids for p in params_of(o))),
                    None)

    def _find_names(self, params: list[torch.Tensor]) -> None:
        """Names from the DDP module that owns these parameters, found once."""
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = self._owner(params, DDP, lambda o: o.module.parameters())
        if ddp is not None:
            self.bind(ddp.module)

    def _find_optimizer(self, params: list[torch.Tensor]) -> None:
        """The optimizer that steps these parameters, found once: its param groups carry the
        learning rate the memory's units follow."""
        opt = self._owner(params, torch.optim.Optimizer, lambda o: (p for g in o.param_groups for p in g["params"]))
        if opt is not None:
            self.groups = {id(p): g for g in opt.param_groups for p in g["params"]}
            return
        log.warning("ringps: no optimizer holds these parameters; the memory stays in gradient units "
                    "(bind(model, optimizer) to keep it in update units)")

    def first_use(self, params: list[torch.Tensor]) -> None:
        """What needs the process group and the DDP model, done on the first bucket (on every
        rank in the same order, so the link probe is a collective they all join)."""
        self._ready = True
        self.device = params[0].device  # every tensor the hook makes lives there (NCCL: CUDA only)
        if not any(id(p) in self.names for p in params):
            self._find_names(params)
        if self.memory_units == "update" and not any(id(p) in self.groups for p in params):
            self._find_optimizer(params)
        self.memory.workers = self.ring.size  # local clipping: clip / sqrt(N)
        if self.cost is None and self.exchange_name == "auto":
            from ringps.comm.probe import measured_cost_params

            self.cost = measured_cost_params(self.process_group, device=self.device)
            if dist.get_rank() == 0:
                log.info("ringps: measured the links: latency %.3g ms, %.0f Mbit/s per link (ring all-reduce); "
                         "exchange=auto prices each bucket with it (state.summary() says what it chose)",
                         self.cost.latency * 1e3, self.cost.bandwidth * 8 / 1e6)
        self.cost = self.cost or CostParams()

    def __getstate__(self) -> dict:
        """Picklable (frameworks that spawn workers send the state along): no thread, ring,
        process group or parameter ids travel; they are rebuilt at first use."""
        state = dict(self.__dict__)
        state.update(_thread=None, _ring=None, process_group=None, names={}, groups={}, _ready=False, deferred=[], _flat={})
        return state

    def summary(self) -> str:
        """One line per bucket of `priced()`: what `exchange` chose at the final density and why
        (each candidate's priced exposed time per step)."""
        lines = []
        for d in self.priced():
            priced = ", ".join(f"{c} {t * 1e3:.1f} ms" for c, t in d["priced_s"].items())
            lines.append(f"bucket of {d['entries']:,} entries in {len(d['sizes'])} tensors, k={d['k']:,}: "
                         f"{d['chosen']} ({priced})")
        bw = f"{self.cost.bandwidth * 8 / 1e6:,.0f} Mbit/s" if self.cost else "not measured yet"
        return f"links {bw}; " + ("; ".join(lines) if lines else "no bucket planned yet")

    def priced(self) -> list[dict[str, Any]]:
        """summary()'s decisions as data (the run folder's rank summaries): per bucket layout at
        the final density, what auto chose and every candidate's priced seconds per step (exposed
        communication; sparse ones before the division by their progress), with the overlap and
        the compute share it weighed them with."""
        share = (self.compute_s or 0.0) / self.model_numel if self.model_numel else 0.0
        return [{"sizes": list(sizes), "entries": sum(sizes), "k": k, "chosen": name,
                 "overlap_s": round(overlap, 6), "compute_share_s": round(share * sum(sizes), 6),
                 "priced_s": {c: round(t, 6) for c, t in sorted(costs.items(), key=lambda x: x[1])}}
                for (sizes, k), (name, costs, overlap) in self.decisions.items()]

    @property
    def ring(self) -> Ring:
        if self._ring is None:
            self._ring = Ring(self.process_group, self.timeout, self.meter)
        return self._ring

    @property
    def thread(self) -> CommThread:
        if self._thread is None:
            self._thread = CommThread()
            atexit.register(self.close)  # a comm thread alive at interpreter exit aborts it (gloo)
        return self._thread

    def close(self) -> None:
        if self._thread is not None:
            self._thread.close()
            self._thread = None

    # -- checkpoints ---------------------------------------------------------------------
    def _generator(self) -> Optional[torch.Generator]:
        """The selector's sampling generator, if it has one (threshold, or auto's threshold)."""
        return getattr(getattr(self.selector, "threshold", self.selector), "gen", None)

    def state_dict(self, all_ranks: bool = False) -> dict[str, Any]:
        """This rank's memory (residuals are per rank: every rank's differ). all_ranks=True, called
        on every rank (a collective), returns every rank's, for a checkpoint that only rank 0
        writes (Lightning's default): `load_state_dict` then takes its own rank's part."""
        gen = self._generator()
        own = {"iteration": self.iteration, "memory": self.memory.state_dict(), "memory_lr": dict(self.memory_lr),
               "selector_rng": gen.get_state() if gen is not None else None,
               "exchanges": {name: ex.state_dict() for name, ex in self.exchanges.items()}}
        if not all_ranks:
            return own
        def gather() -> list:
            every: list = [None] * self.ring.size
            dist.all_gather_object(every, own, group=self.process_group)
            return every

        # on the communication thread: in order with the hook's own collectives on every rank
        return {"ranks": self.thread.submit(gather).wait()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "ranks" in state:  # a checkpoint of every rank: this rank's part
            if len(state["ranks"]) != self.ring.size:
                raise ValueError(f"the checkpoint holds {len(state['ranks'])} ranks' hook states, this job has "
                                 f"{self.ring.size}")
            state = state["ranks"][self.ring.rank]
        self.iteration = state["iteration"]
        self.memory.load_state_dict(state["memory"])
        self.memory_lr = dict(state.get("memory_lr", {}))
        self._flat.clear()  # re-place the loaded buffers into fresh flat accumulators
        self.exchanges.clear()
        for name, saved in state.get("exchanges", {}).items():
            self.exchange(name).load_state_dict(saved)
        gen = self._generator()
        if gen is not None and state.get("selector_rng") is not None:
            gen.set_state(state["selector_rng"])

    # -- the work of one bucket (runs on the communication thread) ------------------------
    MEASURED_STEPS = 3  # steps whose compute sets compute_s when the user gave none

    @property
    def measuring_compute(self) -> bool:
        """auto, and the step's compute not known yet (no profile, no compute_s=): the first
        steps measure it, dense and with every collective inside the hook's time."""
        return self.compute_s is None and self.exchange_name == "auto"

    def step_done(self, backward_end: float) -> None:
        """After the step's last bucket: note its compute, from the last step's end (its last
        bucket done) to this step's last bucket ready (`backward_end`, when DDP called the hook
        with it): the optimizer's step, the data, the forward and the backward. Not the wall less
        the hook's own time: that time runs beside the backward, and the backward it hid (the
        overlap, 0.11 s of facenet's 0.40) would be missing from the compute. After
        MEASURED_STEPS of them every rank takes the slowest rank's median, so all plan alike, and
        the buckets are planned afresh with it."""
        if self._step_end and self.measuring_compute:
            self._steps.append(max(0.0, backward_end - self._step_end))
            if len(self._steps) >= self.MEASURED_STEPS:
                t = torch.tensor([statistics.median(self._steps)], dtype=torch.float64, device=self.device)
                dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.process_group)
                self.compute_s = float(t)
                self.plans.clear()
                self.decisions.clear()
        self._step_end = time.perf_counter()

    def choose(self, sizes: tuple[int, ...], k: int, overlap_s: float,
               candidates: Optional[tuple[str, ...]] = None) -> tuple[str, dict]:
        n = sum(sizes)
        share = (self.compute_s or 0.0) * n / self.model_numel if self.model_numel else 0.0
        return choose_exchange(n, k, self.ring.size, self.cost, overlap_s, candidates=candidates, block=self.block,
                               compute_s=share, progress=self.progress,
                               value_bytes=VALUE_DTYPES[self.value_dtype].itemsize)

    def plan(self, segments: list[Segment], overlap_s: float, step: int = 0) -> str:
        """The bucket's exchange at this step: forced, or the cost model's choice (cached per
        bucket layout and k). In the run's exact tail a forced exchange that carries less than
        the most faithful sparse one gives way to it, and auto chooses among the faithful alone:
        what the memory holds back leaves exactly before the run ends."""
        tail = self.tail_from is not None and step >= self.tail_from
        if self.exchange_name != "auto":
            forced = EXCHANGES.get(self.exchange_name)
            if tail and not forced.whole:
                best = next(c for c in faithful_candidates() if not EXCHANGES.get(c).whole)
                if forced.progress < EXCHANGES.get(best).progress:
                    return best
            return self.exchange_name
        if self.compute_s is None:
            return "dense"  # until the step's compute is known: a sparse step is priced against it
        sizes, k = tuple(s.numel for s in segments), sum(s.k for s in segments)
        if (sizes, k, tail) not in self.plans:
            self.plans[(sizes, k, tail)] = self.choose(sizes, k, overlap_s, faithful_candidates() if tail else None)[0]
            final = sum(self.schedule.k(n, 1 << 62) for n in sizes)
            # what it will do once warmed up, for summary(): one entry per bucket, whatever order
            # DDP's rebuild puts its tensors in (the choice depends on their sizes, not their order)
            key = (tuple(sorted(sizes)), final)
            if key not in self.decisions:
                self.decisions[key] = (*self.choose(sizes, final, overlap_s), overlap_s)
        return self.plans[(sizes, k, tail)]

    def exchange(self, name: str) -> Exchange:
        """The exchange `name`, kept across steps (shared-index carries block scores per tensor)."""
        if name not in self.exchanges:
            self.exchanges[name] = build_exchange(name, self.block, self.value_dtype)
        return self.exchanges[name]


def _complete(fut: torch.futures.Future, buffer: torch.Tensor, inflight: Optional[torch.futures.Future]) -> None:
    """Hand DDP the bucket now, or when its all-reduce lands (its error, if it fails: a timeout
    names what it waited for)."""
    if inflight is None:
        fut.set_result(buffer)
        return

    def done(f: torch.futures.Future) -> None:
        if fut.done():  # a later bucket's failure has failed it already
            return
        try:
            f.value()
        except BaseException as e:  # noqa: BLE001 - DDP re-raises it from backward()
            fut.set_exception(e)
            return
        fut.set_result(buffer)

    inflight.add_done_callback(done)


def ring_topk_hook(state, bucket):
    """DDP communication hook (state: RingTopkState). No annotations on purpose: DDP compares
    them to its own classes, and this module's postponed annotations would be strings."""
    fut: torch.futures.Future = torch.futures.Future()
    buffer, grads, params = bucket.buffer(), bucket.gradients(), bucket.parameters()
    index, last, step = bucket.index(), bucket.is_last(), state.iteration
    called = time.perf_counter()  # on autograd's thread: the last bucket's is the backward's end

    def work() -> None:
        try:
            with trace.get().span(f"bucket {index}", "comm", lane="comm", step=step, density=state.schedule(step)):
                small, inflight = state.process(index, buffer, grads, params, step)
            if small or last:  # the last bucket's future too: the step's work ends before backward() returns
                state.deferred.append((fut, buffer, small, inflight))
            else:
                _complete(fut, buffer, inflight)
            if last:
                with trace.get().span("small tensors (fused)", "comm", lane="comm"):
                    state.reduce_small([t for _, _, ts, _ in state.deferred for t in ts])
                state.iteration += 1
                state.step_done(called)
                pending, state.deferred = state.deferred, []  # only now: a failure above fails them all
                for f, buf, _, inflight in pending:
                    _complete(f, buf, inflight)
        except BaseException as e:  # noqa: BLE001 - DDP re-raises it from backward()
            pending, state.deferred = state.deferred, []
            for f, _, _, _ in pending:
                if not f.done():
                    f.set_exception(e)
            if not fut.done():
                fut.set_exception(e)

    state.thread.submit(work)
    return fut
