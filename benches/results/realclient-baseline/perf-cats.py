import sys, re, collections
from perf_stacks import INNER, samples

inner_pat = re.compile(INNER + r'|AppState')
c=collections.Counter(); tot=0
for head, fr in samples(sys.stdin):
    tot+=1
    thread='sqlx-worker' if 'sqlx-sqlite' in head else 'tokio-worker'
    s=' '.join(fr)
    idx=[i for i,x in enumerate(fr) if 'tower_sqlite_retry' in x]
    if idx and not any(inner_pat.search(x) for x in fr[:idx[0]]): cat='tower_sqlite_retry (own)'
    elif re.search(r'futex|__schedule|schedule\b|finish_task_switch|try_to_wake_up', s): cat='kernel: futex / context switch'
    elif re.search(r'tcp_|sock_|epoll|__sys_recvfrom|__sys_sendto|sendmsg|recvmsg|ip_|net_rx|__x64_sys_(read|write)', s): cat='kernel: network / epoll'
    elif re.search(r'sqlite3|pcache|btree|Pager|wal|unixShm|Vdbe', fr[0]): cat='sqlite (C)'
    elif re.search(r'flume|sqlx', s): cat='sqlx / flume (user)'
    elif re.search(r'hyper|httparse|axum', s): cat='hyper / axum (user)'
    elif re.search(r'tokio', s): cat='tokio (user)'
    else: cat='other'
    c[(thread,cat)]+=1
rps=float(sys.argv[1]); secs=6.0
print(f"samples {tot} = {tot/secs:.0f} ms CPU/s; at {rps:.0f} req/s: {tot/secs/rps*1000:.1f} µs/req")
for (t,k),n in sorted(c.items(), key=lambda x:-x[1]):
    print(f"  {t:13} {k:34} {n:5}  {n/secs/rps*1000:6.1f} µs/req")
