"""The hand-over profile: with handover-probe.patch applied and TSR_HO=1 in the servers'
environment, each server's log has a line per event of the file's turn (`HO <pid> <what>
<ns since the epoch>`). Given cell directories kept by `KEEP=1 bash
loadtest/scripts/wrk-procs.sh OUT` (OUT/cell-*), it prints per cell the time from a process
letting the turn go to another's file thread holding it (the kernel's wake-up) and from that
to the waiting writer's task running (the runtime's wake-up)."""
import sys, glob, statistics as st
for cell in sys.argv[1:]:
    ev=[]
    for f in glob.glob(cell+"/server*.log"):
        for line in open(f):
            if line.startswith("HO "):
                _,pid,what,t=line.split(); ev.append((int(t),int(pid),what))
    ev.sort()
    last_release=None; last_locked={}; kern=[]; tok=[]; gaps=[]
    counts={}
    for t,pid,what in ev:
        counts[what]=counts.get(what,0)+1
        if what.startswith("release"): last_release=(t,pid)
        elif what=="locked":
            if last_release and last_release[1]!=pid: kern.append((t-last_release[0])/1e3)
            last_locked[pid]=t
        elif what=="resumed" and pid in last_locked:
            tok.append((t-last_locked.pop(pid))/1e3)
    q=lambda xs:(f"n={len(xs)} med {st.median(xs):.0f} p90 {sorted(xs)[int(len(xs)*.9)]:.0f} mean {st.mean(xs):.0f} us" if xs else "none")
    dur=(ev[-1][0]-ev[0][0])/1e9 if ev else 0
    print(cell, counts, f"span {dur:.1f}s")
    print("  release->locked (kernel wake of the lock thread):", q(kern))
    print("  locked->resumed (tokio wake of the writer):      ", q(tok))
