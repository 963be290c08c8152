#!/usr/bin/env python3
"""Do the zero-bubble orders survive ptool's rendezvous p2p?  Each compute unit (an action, or an
OVERLAP_F_B pair) gets ptool's add_units batching (train/schedule.cpp): between two units one batch
with the sends of the unit before and the receives of the unit after; then ptool's check_progress
(a rank's consecutive p2p ops are one batch; an op completes when the peer's current batch holds its
partner). Prints 'ok' or the ranks stuck and what they wait in."""
import sys
import importlib.util
spec = importlib.util.spec_from_file_location("z", __file__.replace("zero_bubble_batching.py", "zero_bubble_orders.py"))
z = importlib.util.module_from_spec(spec); spec.loader.exec_module(z)

def ptool_lists(order, s2r, ns):
    recv_in = lambda s: s > 0 and s2r[s - 1] != s2r[s]
    send_out = lambda s: s + 1 < ns and s2r[s + 1] != s2r[s]
    out = {}
    for r, lst in order.items():
        res, sends = [], []
        for a in lst:
            if a is None:
                continue
            unit = list(z.leaves(a))
            batch, nxt = list(sends), []
            for x in unit:
                s, ct, m = x.stage_index, x.computation_type, x.microbatch_index
                if ct == "F":
                    if recv_in(s): batch.append(("RECV_F", s, m))
                    if send_out(s): nxt.append(("SEND_F", s, m))
                elif ct in ("I", "B"):
                    if send_out(s): batch.append(("RECV_B", s, m))
                    if recv_in(s): nxt.append(("SEND_B", s, m))
            res += batch + [("C", x) for x in unit]
            sends = nxt
        res += sends
        out[r] = res
    return out

def partner(a):
    k, s, m = a
    return {"SEND_F": ("RECV_F", s + 1, m), "RECV_F": ("SEND_F", s - 1, m),
            "SEND_B": ("RECV_B", s - 1, m), "RECV_B": ("SEND_B", s + 1, m)}[k]

def check_progress(lists, s2r):
    n = len(lists); pos = {r: 0 for r in lists}; done = {r: [False] * len(lists[r]) for r in lists}
    p2p = lambda a: a[0] != "C"
    def bend(r):
        e = pos[r]
        while e < len(lists[r]) and p2p(lists[r][e]): e += 1
        return e
    progress = True
    while progress:
        progress = False
        for r in lists:
            while pos[r] < len(lists[r]) and not p2p(lists[r][pos[r]]):
                pos[r] += 1; progress = True
            if pos[r] == len(lists[r]): continue
            end = bend(r); allok = True
            for i in range(pos[r], end):
                if done[r][i]: continue
                want = partner(lists[r][i]); peer = s2r[want[1]]
                if pos[peer] == len(lists[peer]) or not p2p(lists[peer][pos[peer]]):
                    allok = False; continue
                met = False
                for j in range(pos[peer], bend(peer)):
                    if not done[peer][j] and lists[peer][j] == want:
                        done[peer][j] = done[r][i] = met = progress = True; break
                allok = allok and met
            if allok: pos[r] = end; progress = True
    stuck = [f"rank {r} waits in {lists[r][pos[r]]}" for r in lists if pos[r] < len(lists[r])]
    return stuck

if __name__ == "__main__":
    for kind, v in (("zbv", 2), ("izb", 2), ("izb", 1), ("dualpipev", 2)):
        for p, m in ((2, 4), (2, 8), (4, 8), (4, 16), (8, 16), (8, 32)):
            name, order, ns, _ = z.build(kind, p, m, v)
            s2r = z.validate_schedule(order, p, ns, m)
            stuck = check_progress(ptool_lists(order, s2r, ns), s2r)
            print(f"{name} pp={p} m={m}" + (f" v={v}" if kind == "izb" else "") + ": "
                  + ("ok" if not stuck else "DEADLOCK: " + "; ".join(stuck)))
