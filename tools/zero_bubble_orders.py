#!/usr/bin/env python3
"""Per-rank action orders of torch.distributed.pipelining's zero-bubble schedules, without torch.

A line-by-line port of the compute-order generators in
  pytorch/pytorch  torch/distributed/pipelining/schedules.py  @ 00722e648b740f91d0e71494baa17891749fd291
(the stored snapshot read for issue 49) and of generate_stage_to_rank_mapping /
generate_rank_to_stage_mapping from torch/distributed/pipelining/_utils.py (style "v"):

  ScheduleInterleavedZeroBubble._calculate_single_rank_operations  (+ _get_warmup_ops,
      _get_1f1b_rank_ops(enable_zero_bubble=True), _add_bubbles_to_actions)
  ScheduleZBVZeroBubble._calculate_single_rank_operations
  ScheduleDualPipeV._calculate_single_rank_operations
  _validate_schedule, _add_reduce_grad, _add_unshard_reshard, _merge_bw, _add_send_recv  (lowering)

and, beyond torch, this script's own checks (every (stage, microbatch) has F once and either B once
or I and W once each; I (or B) after F; W after I; the V map puts stages s and 2p-1-s on rank s)
and a unit-time list simulation (each rank runs its list in order; F(s,m) waits for F(s-1,m),
I/B(s,m) for I/B(s+1,m); no transfer time) giving makespan, bubble and the deferred-W depth.

Usage:
  python3 zero_bubble_orders.py                      # the worked cases of docs (zero_bubble.md)
  python3 zero_bubble_orders.py zbv PP M             # one case
  python3 zero_bubble_orders.py izb PP M V
  python3 zero_bubble_orders.py dualpipev PP M
  python3 zero_bubble_orders.py ... --lower          # also the lowered lists (UNSHARD/RESHARD,
                                                     # REDUCE_GRAD, SEND_*/RECV_*)
  python3 zero_bubble_orders.py ... --times F I W    # durations for the simulation (default 1 1 1)
"""
from __future__ import annotations

import sys
from collections import defaultdict
from typing import NamedTuple, Optional

SOURCE_COMMIT = "00722e648b740f91d0e71494baa17891749fd291"

# ---- _ComputationType / _Action (schedules.py) -------------------------------------------------
F, I, W, B = "F", "I", "W", "B"
UNSHARD, RESHARD = "UNSHARD", "RESHARD"
SEND_F, RECV_F, SEND_B, RECV_B = "SEND_F", "RECV_F", "SEND_B", "RECV_B"
OVERLAP_F_B, REDUCE_GRAD = "OVERLAP_F_B", "REDUCE_GRAD"
FORWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, FULL_BACKWARD = F, I, W, B
COMPUTE = (F, B, I, W, OVERLAP_F_B)


class Action(NamedTuple):
    stage_index: int
    computation_type: str
    microbatch_index: Optional[int] = None
    sub_actions: Optional[tuple] = None

    def __repr__(self):  # _Action.__repr__
        if self.sub_actions is not None:
            return f"({';'.join(repr(a) for a in self.sub_actions)}){self.computation_type}"
        s = f"{self.stage_index}{self.computation_type}"
        if self.microbatch_index is not None:
            s += str(self.microbatch_index)
        return s

    __str__ = __repr__


# ---- _utils.py ---------------------------------------------------------------------------------
def generate_stage_to_rank_mapping(pp_size, num_stages, style="loop"):
    mapping = {}
    if style == "loop":
        for stage_index in range(num_stages):
            mapping[stage_index] = stage_index % pp_size
    elif style == "v":
        if num_stages % pp_size != 0:
            raise ValueError(f"num_stages {num_stages} must be evenly divisible by pp_size {pp_size} for V schedules")
        rank_index = 0
        for stage_index in range(num_stages):
            mapping[stage_index] = rank_index
            if (stage_index + 1) % pp_size == 0:  # dont change rank on the border (keep the V)
                continue
            if (stage_index // pp_size) % 2 == 0:
                rank_index += 1
            else:
                rank_index -= 1
    else:
        raise ValueError(f"Style {style} is not supported.")
    return mapping


def generate_rank_to_stage_mapping(pp_size, num_stages, style="loop"):
    rank_to_stages = {}
    for stage_id, rank in generate_stage_to_rank_mapping(pp_size, num_stages, style).items():
        rank_to_stages.setdefault(rank, []).append(stage_id)
    return rank_to_stages


# ---- interleaved helpers (schedules.py) --------------------------------------------------------
def _get_warmup_ops(rank, n_local_stages, microbatches_per_round, pp_group_size, n_microbatches, multiply_factor=2):
    warmups_ops_last_stage = (n_local_stages - 1) * microbatches_per_round
    warmup_ops = warmups_ops_last_stage + multiply_factor * ((pp_group_size - 1) - rank)
    return min(warmup_ops, n_microbatches * n_local_stages)


def _get_1f1b_rank_ops(n_local_stages, pp_group_size, warmup_ops, fwd_bwd_ops, cooldown_ops, rank,
                       forward_stage_index, backward_stage_index, num_1f1b_microbatches=0,
                       enable_zero_bubble=False):
    fwd_stage_mb_index = defaultdict(int)
    bwd_stage_mb_index = defaultdict(int)
    weight_stage_mb_index = defaultdict(int)
    rank_ops = [None for _ in range(rank)]
    post_warmup_ops = (n_local_stages * pp_group_size + 2 * (pp_group_size - 1 - rank)) - (warmup_ops + rank)
    if enable_zero_bubble:
        post_warmup_ops = pp_group_size - rank - 1
    total_ops = warmup_ops + fwd_bwd_ops + cooldown_ops
    backward_op_ids = []
    weight_op_count = 0
    FULL_BACKWARD_OR_BACKWARD_INPUT = I if enable_zero_bubble else B

    def take(d, s):
        mb = d[s]
        d[s] = mb + 1
        return mb

    for op in range(total_ops):
        if op < warmup_ops:
            fs = forward_stage_index(op)
            rank_ops.append(Action(fs, F, take(fwd_stage_mb_index, fs)))
            if op == warmup_ops - 1:
                rank_ops.extend([None] * post_warmup_ops)
        elif warmup_ops <= op < warmup_ops + fwd_bwd_ops:
            fs = forward_stage_index(op)
            rank_ops.append(Action(fs, F, take(fwd_stage_mb_index, fs)))
            bs = backward_stage_index(op)
            rank_ops.append(Action(bs, FULL_BACKWARD_OR_BACKWARD_INPUT, take(bwd_stage_mb_index, bs)))
            backward_op_ids.append(op)
            if enable_zero_bubble and op - warmup_ops >= num_1f1b_microbatches:
                ws = backward_stage_index(backward_op_ids[weight_op_count])
                rank_ops.append(Action(ws, W, take(weight_stage_mb_index, ws)))
                weight_op_count += 1
        else:
            if not enable_zero_bubble:
                rank_ops.append(None)
            bs = backward_stage_index(op)
            rank_ops.append(Action(bs, FULL_BACKWARD_OR_BACKWARD_INPUT, take(bwd_stage_mb_index, bs)))
            backward_op_ids.append(op)
            if enable_zero_bubble and op - warmup_ops >= num_1f1b_microbatches:
                ws = backward_stage_index(backward_op_ids[weight_op_count])
                rank_ops.append(Action(ws, W, take(weight_stage_mb_index, ws)))
                weight_op_count += 1
    while enable_zero_bubble and weight_op_count < len(backward_op_ids):
        ws = backward_stage_index(backward_op_ids[weight_op_count])
        rank_ops.append(Action(ws, W, take(weight_stage_mb_index, ws)))
        weight_op_count += 1
    return rank_ops


# ---- ScheduleInterleavedZeroBubble --------------------------------------------------------------
def interleaved_zero_bubble(pp, m, v):
    number_of_rounds = max(1, m // pp)
    microbatches_per_round = m // number_of_rounds
    if m % number_of_rounds != 0:
        raise ValueError("Zero bubble requires the number of microbatches to be a multiple of the number "
                         f"of rounds ({number_of_rounds}), but got {m}.")

    def rank_ops(rank):
        warmup_ops = _get_warmup_ops(rank, v, microbatches_per_round, pp, m, multiply_factor=1)
        microbatch_ops = v * m
        fwd_bwd_ops = microbatch_ops - warmup_ops
        cooldown_ops = microbatch_ops - fwd_bwd_ops

        def forward_stage_index(step):
            return ((step // microbatches_per_round) % v) * pp + rank

        def backward_stage_index(step):
            return (v - 1 - ((step - warmup_ops) // microbatches_per_round) % v) * pp + rank

        return _get_1f1b_rank_ops(v, pp, warmup_ops, fwd_bwd_ops, cooldown_ops, rank, forward_stage_index,
                                  backward_stage_index, rank, enable_zero_bubble=True)

    order = {r: rank_ops(r) for r in range(pp)}
    return _add_bubbles_to_actions(order, pp, v * pp)


def _add_bubbles_to_actions(actions, pp, num_stages_global):
    # note: need_bubble checks F and FULL_BACKWARD only; an I never waits here (as in torch)
    def need_bubble(stage, op, microbatch, seen_ops):
        if op == F:
            if stage != 0 and (stage - 1, op, microbatch) not in seen_ops:
                return True
        elif op == B:
            if stage == num_stages_global - 1:
                return (stage, F, microbatch) not in seen_ops
            return (stage + 1, op, microbatch) not in seen_ops
        return False

    seen_ops = set()
    result = {r: [] for r in range(pp)}
    next_pointer = {r: 0 for r in range(pp)}
    while True:
        should_stop = True
        temp_seen_ops = set()
        for rank in range(pp):
            ts = next_pointer[rank]
            if ts >= len(actions[rank]):
                continue
            should_stop = False
            a = actions[rank][ts]
            if a is not None:
                if not need_bubble(a.stage_index, a.computation_type, a.microbatch_index, seen_ops):
                    result[rank].append(a)
                    if a.microbatch_index is not None:
                        temp_seen_ops.add((a.stage_index, a.computation_type, a.microbatch_index))
                    next_pointer[rank] += 1
                else:
                    result[rank].append(None)
            else:
                next_pointer[rank] += 1
                result[rank].append(None)
        seen_ops.update(temp_seen_ops)
        if should_stop:
            break
    return result


# ---- ScheduleZBVZeroBubble ----------------------------------------------------------------------
def zbv_zero_bubble(pp, m):
    num_stages = 2 * pp

    def rank_ops_of(rank):
        n_micro = max(2 * pp - 1, m)
        rank_ops = [None for _ in range(rank)]
        f0_cnt = f1_cnt = b0_cnt = b1_cnt = 0
        warmup_n1 = 2 * (pp - rank) - 1
        c0, c1 = rank, num_stages - 1 - rank
        for _ in range(warmup_n1):
            rank_ops.append(Action(c0, F, f0_cnt)); f0_cnt += 1
        for _ in range(rank):  # warmup_n2
            rank_ops.append(Action(c1, F, f1_cnt)); f1_cnt += 1
            rank_ops.append(Action(c0, F, f0_cnt)); f0_cnt += 1
        for _ in range(pp - rank):  # warmup_n3
            rank_ops.append(Action(c1, F, f1_cnt)); f1_cnt += 1
            rank_ops.append(Action(c1, I, b1_cnt))
            rank_ops.append(Action(c1, W, b1_cnt)); b1_cnt += 1
        while f1_cnt < f0_cnt or f0_cnt < n_micro:  # stable phase
            if f0_cnt < n_micro:
                rank_ops.append(Action(c0, F, f0_cnt)); f0_cnt += 1
            rank_ops.append(Action(c0, I, b0_cnt))
            rank_ops.append(Action(c0, W, b0_cnt)); b0_cnt += 1
            rank_ops.append(Action(c1, F, f1_cnt)); f1_cnt += 1
            rank_ops.append(Action(c1, I, b1_cnt))
            rank_ops.append(Action(c1, W, b1_cnt)); b1_cnt += 1
        w0_cnt, w1_cnt = b0_cnt, b1_cnt  # cool-down
        for _ in range(rank):  # cooldown_n1
            rank_ops.append(Action(c0, I, b0_cnt)); b0_cnt += 1
            rank_ops.append(Action(c1, I, b1_cnt)); b1_cnt += 1
        for _ in range(pp - rank):  # cooldown_n2
            rank_ops.append(Action(c0, I, b0_cnt)); b0_cnt += 1
            rank_ops.append(Action(c0, W, w0_cnt)); w0_cnt += 1
        while w1_cnt < b1_cnt:
            rank_ops.append(Action(c1, W, w1_cnt)); w1_cnt += 1
        while w0_cnt < b0_cnt:
            rank_ops.append(Action(c0, W, w0_cnt)); w0_cnt += 1
        assert w0_cnt == b0_cnt == f0_cnt and w1_cnt == b1_cnt == f1_cnt
        return [a if a is not None and a.microbatch_index is not None and a.microbatch_index < m else None
                for a in rank_ops]

    return {r: rank_ops_of(r) for r in range(pp)}


# ---- ScheduleDualPipeV --------------------------------------------------------------------------
def dualpipev(pp, m):
    if m < 2 * pp:
        raise ValueError(f"DualPipeV requires at least as many microbatches as stages, but got {m} "
                         f"microbatches and {2 * pp} stages.")

    def rank_ops_of(rank):
        actions = []
        counters = {}
        weight_queue = []
        stage0_index, stage1_index = generate_rank_to_stage_mapping(pp, pp * 2, style="v")[rank]

        def increment_backward_counts(s):
            counters[(s, I)] = counters.get((s, I), 0) + 1
            counters[(s, W)] = counters.get((s, W), 0) + 1

        def add_overlap_f_b(fs, bs):
            fmb = counters.get((fs, F), 0)
            bmb = counters.get((bs, I), 0)
            actions.append(Action(-1, OVERLAP_F_B, None, (Action(fs, F, fmb), Action(bs, B, bmb))))
            counters[(fs, F)] = fmb + 1
            increment_backward_counts(bs)

        def add_action(s, ct):
            key = (s, ct) if ct != B else (s, I)
            mb = counters.get(key, 0)
            actions.append(Action(s, ct, mb))
            if ct == B:
                increment_backward_counts(s)
            else:
                if ct == I:
                    weight_queue.append((s, mb))
                counters[key] = mb + 1

        def add_weight_action_if_pending():
            if not weight_queue:
                return
            s, mb = weight_queue.pop(0)
            actions.append(Action(s, W, mb))
            counters[(s, W)] = counters.get((s, W), 0) + 1

        for _ in range((pp - rank - 1) * 2):  # Step 1: F0
            add_action(stage0_index, F)
        for _ in range(rank + 1):  # Step 2: F0F1
            add_action(stage0_index, F)
            add_action(stage1_index, F)
        for _ in range(pp - rank - 1):  # Step 3: I1W1F1
            add_action(stage1_index, I)
            add_weight_action_if_pending()
            add_action(stage1_index, F)
        for i in range(m - pp * 2 + rank + 1):  # Step 4 (main): F0B1-F1B0
            if i == 0 and rank == pp - 1:
                add_action(stage0_index, F)
                add_action(stage1_index, B)
            else:
                add_overlap_f_b(stage0_index, stage1_index)
            add_overlap_f_b(stage1_index, stage0_index)
        for _ in range(pp - rank - 1):  # Step 5: B1-F1B0
            add_action(stage1_index, B)
            add_overlap_f_b(stage1_index, stage0_index)
        step_6 = rank + 1  # Step 6: B1B0, second half zero bubble
        enable_zb = False
        for i in range(step_6):
            if i == step_6 // 2 and rank % 2 == 1:
                enable_zb = True
            add_action(stage1_index, I if enable_zb else B)
            if i == step_6 // 2 and rank % 2 == 0:
                enable_zb = True
            add_action(stage0_index, I if enable_zb else B)
        for _ in range(pp - rank - 1):  # Step 7: W0B0
            add_weight_action_if_pending()
            add_action(stage0_index, I if enable_zb else B)
        for _ in range(rank + 1):  # Step 8: W0
            add_weight_action_if_pending()
        return actions

    return {r: rank_ops_of(r) for r in range(pp)}


# ---- _validate_schedule (schedules.py) ----------------------------------------------------------
def validate_schedule(actions, pp_group_size, num_stages, num_microbatches):
    assert len(actions) == pp_group_size
    sa = {s: {F: set(), B: set(), I: set(), W: set()} for s in range(num_stages)}
    s2r = {}

    def process(a, rank, step):
        s, ct, mb = a.stage_index, a.computation_type, a.microbatch_index
        if ct == F:
            sa[s][F].add(mb)
        elif ct == B:
            if mb not in sa[s][F]:
                raise AssertionError(f"Rank {rank}, step {step}: Running Full Backward for stage {s}, microbatch {mb} without first running Forward")
            sa[s][B].add(mb)
        elif ct == I:
            if mb not in sa[s][F]:
                raise AssertionError(f"Rank {rank}, step {step}: Running Backward Input for stage {s}, microbatch {mb} without first running Forward")
            sa[s][I].add(mb)
        elif ct == W:
            if mb not in sa[s][I]:
                raise AssertionError(f"Rank {rank}, step {step}: Running Backward Weight for stage {s}, microbatch {mb} without first running Backward Input")
            sa[s][W].add(mb)
        if s not in s2r:
            s2r[s] = rank
        elif s2r[s] != rank:
            raise AssertionError(f"Rank {rank}, step {step}: Stage {s} is assigned to both rank {rank} and rank {s2r[s]}")

    for rank in actions:  # note: torch walks rank by rank, so cross-rank order is not checked here
        for step, a in enumerate(actions[rank]):
            if a is None:
                continue
            for sub in (a.sub_actions if a.sub_actions is not None else (a,)):
                process(sub, rank, step)
    for s in sa:
        f, b, i, w = (len(sa[s][k]) for k in (F, B, I, W))
        if f != num_microbatches:
            raise AssertionError(f"Got {f} F microbatches for stage {s}, expected {num_microbatches}")
        if i != w:
            raise AssertionError(f"Invalid backward microbatches for stage {s}: I and W must have equal counts, but got I={i}, W={w}")
        if b + (i + w) // 2 != num_microbatches:
            raise AssertionError(f"Invalid backward microbatches for stage {s}: expected {num_microbatches} total backwards, but got B={b}, I={i}, W={w}")
    return s2r


# ---- lowering passes (schedules.py) -------------------------------------------------------------
def add_reduce_grad(actions, n_microbatches):
    out, cnt = [], defaultdict(int)
    for a in actions:
        if a is None:
            continue
        out.append(a)
        sched = []
        for leaf in (a.sub_actions if a.computation_type == OVERLAP_F_B and a.sub_actions else (a,)):
            if leaf.computation_type in (W, B):
                cnt[leaf.stage_index] += 1
                if cnt[leaf.stage_index] == n_microbatches:
                    sched.append(leaf.stage_index)
        out.extend(Action(s, REDUCE_GRAD, None) for s in sched)
    return out


def add_unshard_reshard(compute_actions, max_active_stages=3):
    def next_stage_indices(count, next_actions):
        seen, ret = set(), []
        for a in next_actions:
            if a is None:
                continue
            if a.computation_type == OVERLAP_F_B and a.sub_actions is not None:
                for sub in a.sub_actions:
                    if sub.stage_index not in seen:
                        seen.add(sub.stage_index); ret.append(sub.stage_index)
                if len(ret) >= count:
                    break
            elif a.stage_index not in seen:
                seen.add(a.stage_index); ret.append(a.stage_index)
                if len(ret) == count:
                    break
        return ret

    active, out = set(), []
    for i, a in enumerate(compute_actions):
        if a is None:
            continue
        next_n = next_stage_indices(max_active_stages, compute_actions[i:])
        fetch = [s for s in next_n if s not in active]
        evict = [s for s in active if s not in next_n]
        for s in evict:
            active.remove(s); out.append(Action(s, RESHARD, None))
        for s in fetch:
            active.add(s); out.append(Action(s, UNSHARD, None))
        out.append(a)
    for s in list(active):
        active.remove(s); out.append(Action(s, RESHARD, None))
    return out


def merge_bw(compute_actions):
    compute_actions = list(compute_actions)
    merged = []
    while compute_actions:
        a = compute_actions.pop(0)
        if a is None:
            continue
        while compute_actions and compute_actions[0] is None:
            compute_actions.pop(0)
        n = compute_actions[0] if compute_actions else None
        if (a.computation_type == I and n is not None and n.computation_type == W
                and a.stage_index == n.stage_index and a.microbatch_index == n.microbatch_index):
            merged.append(Action(a.stage_index, B, a.microbatch_index)); compute_actions.pop(0)
        else:
            merged.append(a)
    return merged


def add_send_recv(compute_actions, stage_to_rank, num_stages):
    compute_actions = {r: list(v) for r, v in compute_actions.items()}
    comm = {r: [] for r in compute_actions}
    prev = {r: set() for r in compute_actions}

    def has_comms(a):
        if a.computation_type == F:
            return a.stage_index != num_stages - 1 and stage_to_rank(a.stage_index + 1) != stage_to_rank(a.stage_index)
        if a.computation_type in (I, B):
            return a.stage_index != 0 and stage_to_rank(a.stage_index - 1) != stage_to_rank(a.stage_index)
        return False

    def get_comms(a):
        s, ct, mb = a.stage_index, a.computation_type, a.microbatch_index
        send = Action(s, SEND_F if ct == F else SEND_B, mb)
        recv = Action(s + 1 if ct == F else s - 1, RECV_F if ct == F else RECV_B, mb)
        return send, recv

    def ready(a, p):
        if a is None:
            return True
        if a.computation_type == F and a.stage_index != 0:
            return Action(a.stage_index, RECV_F, a.microbatch_index) in p or Action(a.stage_index - 1, F, a.microbatch_index) in p
        if a.computation_type in (I, B) and a.stage_index != num_stages - 1:
            return (Action(a.stage_index, RECV_B, a.microbatch_index) in p
                    or Action(a.stage_index + 1, I, a.microbatch_index) in p
                    or Action(a.stage_index + 1, B, a.microbatch_index) in p)
        return True

    while compute_actions:
        progress = False
        for rank in sorted(compute_actions):
            a = compute_actions[rank][0]
            subs = a.sub_actions if (a is not None and a.sub_actions is not None) else (a,)
            if not all(ready(x, prev[rank]) for x in subs):
                continue
            if a is not None:
                comm[rank].append(a)
                for x in subs:
                    prev[rank].add(x)
                    if has_comms(x):
                        send, recv = get_comms(x)
                        comm[rank].append(send); prev[rank].add(send)
                        rr = stage_to_rank(recv.stage_index)
                        comm[rr].append(recv); prev[rr].add(recv)
            compute_actions[rank].pop(0)
            if not compute_actions[rank]:
                del compute_actions[rank]
            progress = True
        if not progress:
            raise AssertionError("Malformed compute schedule, can't schedule sends/recvs")
    return comm


def lower(order, s2r, num_stages, m):
    """_PipelineScheduleRuntime._prepare_schedule_with_comms(format="compute_only")."""
    lowered = {r: add_reduce_grad(add_unshard_reshard(order[r]), m) for r in order}
    return add_send_recv(lowered, lambda s: s2r[s], num_stages)


# ---- this script's own checks -------------------------------------------------------------------
def leaves(a):
    return a.sub_actions if a.sub_actions is not None else (a,)


def own_checks(name, order, pp, num_stages, m, v_map):
    problems = []
    s2r = {}
    for r, lst in order.items():
        seen = {}
        pos = 0
        for a in lst:
            if a is None:
                continue
            for x in leaves(a):
                key = (x.stage_index, x.computation_type, x.microbatch_index)
                if key in seen:
                    problems.append(f"rank {r}: {x} twice")
                seen[key] = pos
                s2r.setdefault(x.stage_index, r)
                if s2r[x.stage_index] != r:
                    problems.append(f"stage {x.stage_index} on ranks {s2r[x.stage_index]} and {r}")
            pos += 1
        for s in [s for s in range(num_stages) if s2r.get(s) == r]:
            for mb in range(m):
                f = seen.get((s, F, mb)); b = seen.get((s, B, mb))
                i = seen.get((s, I, mb)); w = seen.get((s, W, mb))
                if f is None:
                    problems.append(f"rank {r}: no {s}F{mb}")
                if (b is None) == (i is None):
                    problems.append(f"rank {r}: stage {s} mb {mb}: B={b} I={i} (exactly one of B, I)")
                if (i is None) != (w is None):
                    problems.append(f"rank {r}: stage {s} mb {mb}: I={i} W={w} (W once iff I)")
                bi = b if b is not None else i
                if f is not None and bi is not None and bi <= f:
                    problems.append(f"rank {r}: {s}{'B' if b is not None else 'I'}{mb} not after {s}F{mb}")
                if i is not None and w is not None and w <= i:
                    problems.append(f"rank {r}: {s}W{mb} not after {s}I{mb}")
    for s in range(num_stages):
        if s not in s2r:
            problems.append(f"stage {s} never runs")
    if v_map:
        for s in range(num_stages):
            want = s if s < pp else 2 * pp - 1 - s
            if s2r.get(s) != want:
                problems.append(f"V map: stage {s} on rank {s2r.get(s)}, want {want}")
    # W order per stage = microbatch order (ptool's bitwise gradient rule)
    for r, lst in order.items():
        last = defaultdict(lambda: -1)
        for a in lst:
            if a is None:
                continue
            for x in leaves(a):
                if x.computation_type in (W, B):
                    if x.microbatch_index < last[x.stage_index]:
                        problems.append(f"rank {r}: stage {x.stage_index} accumulates mb {x.microbatch_index} after {last[x.stage_index]}")
                    last[x.stage_index] = x.microbatch_index
    return s2r, problems


def simulate(order, s2r, num_stages, tf=1.0, ti=1.0, tw=1.0):
    """Unit list simulation: rank busy serially; F(s,m) after F(s-1,m); I/B(s,m) after I/B(s+1,m)."""
    dur = {F: tf, I: ti, W: tw, B: ti + tw}
    lists = {r: [a for a in order[r] if a is not None] for r in order}
    end = {}
    pos = {r: 0 for r in lists}
    free = {r: 0.0 for r in lists}
    busy = {r: 0.0 for r in lists}
    first = {r: None for r in lists}
    inflight_w = {r: 0 for r in lists}   # I done, W not yet (deferred-W state held)
    peak_w = {r: 0 for r in lists}
    live = {r: 0 for r in lists}         # F done, W (or B) not yet: activations held
    peak_live = {r: 0 for r in lists}

    def dep(x):
        s, ct, mb = x.stage_index, x.computation_type, x.microbatch_index
        if ct == F:
            return [] if s == 0 else [(s - 1, F, mb)]
        if ct in (I, B):
            if s == num_stages - 1:
                return [(s, F, mb)]
            return [(s + 1, "BI", mb)]
        return [(s, I, mb)]

    def done_at(k):
        s, ct, mb = k
        if ct == "BI":
            return end.get((s, I, mb), end.get((s, B, mb)))
        return end.get(k)

    remaining = sum(len(l) for l in lists.values())
    while remaining:
        progress = False
        for r in lists:
            while pos[r] < len(lists[r]):
                a = lists[r][pos[r]]
                subs = leaves(a)
                ready = [done_at(k) for x in subs for k in dep(x)]
                if any(t is None for t in ready):
                    break
                start = max([free[r]] + ready)
                t = sum(dur[x.computation_type] for x in subs)
                for x in subs:
                    end[(x.stage_index, x.computation_type, x.microbatch_index)] = start + t
                    if x.computation_type == F:
                        live[r] += 1
                    elif x.computation_type == I:
                        inflight_w[r] += 1
                    elif x.computation_type == W:
                        inflight_w[r] -= 1; live[r] -= 1
                    elif x.computation_type == B:
                        live[r] -= 1
                    peak_w[r] = max(peak_w[r], inflight_w[r]); peak_live[r] = max(peak_live[r], live[r])
                free[r] = start + t
                if first[r] is None:
                    first[r] = start
                busy[r] += t
                pos[r] += 1; remaining -= 1; progress = True
        if not progress and remaining:
            stuck = {r: lists[r][pos[r]] for r in lists if pos[r] < len(lists[r])}
            raise AssertionError(f"deadlock: {stuck}")
    makespan = max(free.values())
    maxbusy = max(busy.values())
    return {"makespan": makespan, "busy": busy, "bubble_ptool": (makespan - maxbusy) / maxbusy,
            "idle_per_rank": {r: makespan - busy[r] for r in busy},
            # the paper's parallelogram measure: idle between a rank's own first start and own end
            "own_span_idle": {r: free[r] - first[r] - busy[r] for r in busy},
            "peak_deferred_W": peak_w, "peak_live_F": peak_live}


# ---- printing ---------------------------------------------------------------------------------
def fmt_rank(lst, keep_none=False):
    return " ".join("." if a is None else str(a) for a in lst if keep_none or a is not None)


def build(kind, pp, m, v=2):
    if kind == "zbv":
        return "ScheduleZBVZeroBubble", zbv_zero_bubble(pp, m), 2 * pp, True
    if kind == "izb":
        return "ScheduleInterleavedZeroBubble", interleaved_zero_bubble(pp, m, v), v * pp, False
    if kind == "dualpipev":
        return "ScheduleDualPipeV", dualpipev(pp, m), 2 * pp, True
    raise SystemExit(f"unknown schedule {kind}")


def report(kind, pp, m, v=2, do_lower=False, times=(1.0, 1.0, 1.0)):
    name, order, ns, vmap = build(kind, pp, m, v)
    head = f"== {name} pp={pp} microbatches={m}" + (f" stages/rank={v}" if kind == "izb" else "") + f" ({ns} stages)"
    print(head)
    s2r = validate_schedule(order, pp, ns, m)
    print("   torch _validate_schedule: ok; stage->rank " + ", ".join(f"{s}:{s2r[s]}" for s in sorted(s2r)))
    s2r2, problems = own_checks(name, order, pp, ns, m, vmap)
    print("   own checks: " + ("ok (F once; B once or I+W once; I/B after F; W after I; W/B per stage in microbatch order"
                              + ("; V map s,2p-1-s on rank s" if vmap else "") + ")" if not problems else "; ".join(problems)))
    for r in range(pp):
        print(f"   rank {r}: {fmt_rank(order[r], keep_none=True)}")
    sim = simulate(order, s2r, ns, *times)
    tf, ti, tw = times
    print(f"   sim F={tf} I={ti} W={tw}: makespan {sim['makespan']:g}, per-rank work {max(sim['busy'].values()):g}, "
          f"bubble (makespan-work)/work {sim['bubble_ptool']:.4f}; idle per rank "
          + ", ".join(f"{r}:{t:g}" for r, t in sim["idle_per_rank"].items())
          + "; idle within each rank's own span " + ", ".join(f"{r}:{t:g}" for r, t in sim["own_span_idle"].items()))
    print("   peak (I done, W pending) per rank: " + ", ".join(f"{r}:{n}" for r, n in sim["peak_deferred_W"].items())
          + "; peak (F done, W/B pending) per rank: " + ", ".join(f"{r}:{n}" for r, n in sim["peak_live_F"].items()))
    if do_lower:
        low = lower(order, s2r, ns, m)
        print("   lowered (_add_unshard_reshard, _add_reduce_grad, _add_send_recv):")
        for r in range(pp):
            print(f"     rank {r}: {fmt_rank(low[r])}")
    print()


def mutation_demo():
    """The issue's list-level faults on ZBV pp=2 m=4: what torch's _validate_schedule and the own checks say."""
    print("== list faults on ScheduleZBVZeroBubble pp=2 m=4")
    base = zbv_zero_bubble(2, 4)

    def mutate(what):
        o = {r: list(v) for r, v in base.items()}
        if what == "W skipped (drop 0W1 on rank 0)":
            o[0].remove(Action(0, W, 1))
        elif what == "W before I (swap 3I0, 3W0 on rank 0)":
            i = o[0].index(Action(3, I, 0)); o[0][i], o[0][i + 1] = o[0][i + 1], o[0][i]
        elif what == "W twice (2W1 again at the end of rank 1)":
            o[1].append(Action(2, W, 1))
        return o

    for what in ("W skipped (drop 0W1 on rank 0)", "W before I (swap 3I0, 3W0 on rank 0)",
                 "W twice (2W1 again at the end of rank 1)"):
        o = mutate(what)
        try:
            validate_schedule(o, 2, 4, 4); t = "passes"
        except AssertionError as e:
            t = str(e).splitlines()[0]
        _, probs = own_checks("", o, 2, 4, 4, True)
        print(f"   {what}\n     torch: {t}\n     own:   {'; '.join(probs) if probs else 'passes'}")
    print()


def main(argv):
    do_lower = "--lower" in argv
    times = (1.0, 1.0, 1.0)
    if "--times" in argv:
        k = argv.index("--times")
        times = tuple(float(x) for x in argv[k + 1:k + 4])
        argv = argv[:k] + argv[k + 4:]
    args = [a for a in argv if a != "--lower"]
    print(f"# port of torch/distributed/pipelining/schedules.py @ {SOURCE_COMMIT}\n")
    if args:
        kind, pp, m = args[0], int(args[1]), int(args[2])
        v = int(args[3]) if len(args) > 3 else 2
        report(kind, pp, m, v, do_lower, times)
        return
    report("zbv", 2, 4, do_lower=True, times=times)
    report("zbv", 4, 8, times=times)
    report("izb", 2, 4, 2, do_lower=True, times=times)
    report("izb", 4, 8, 1, times=times)   # one stage per rank: the paper's ZB-H1 (torch: "ZB1P")
    report("dualpipev", 2, 4, do_lower=True, times=times)
    report("dualpipev", 4, 8, times=times)
    mutation_demo()
    # refusals
    for kind, pp, m, v in (("dualpipev", 2, 3, 2), ("izb", 4, 9, 2)):
        try:
            build(kind, pp, m, v)
            print(f"== {kind} pp={pp} m={m}: accepted")
        except ValueError as e:
            print(f"== {kind} pp={pp} m={m}" + (f" v={v}" if kind == "izb" else "") + f": ValueError: {e}")


if __name__ == "__main__":
    main(sys.argv[1:])
