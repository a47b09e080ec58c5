# Per-round ratios to `immediate` from a writepath.json: python3 ratios.py writepath.json [split|mixed|writes]
import json,sys,statistics as st
d=json.load(open(sys.argv[1]))
load=sys.argv[2] if len(sys.argv)>2 else 'split'
rounds={}
for r in d:
    if r['load']!=load: continue
    rounds.setdefault((r['round'],r['connections']),{})[r['config']]=r
cfgs=sorted({r['config'] for r in d})
for c in cfgs:
    if c=='immediate': continue
    w=[];rd=[];p=[];cpu=[]
    for k,v in sorted(rounds.items()):
        if c in v and 'immediate' in v:
            i=v['immediate'];x=v[c]
            w.append(x['writes_per_s']/i['writes_per_s'])
            if i['reads_per_s']>0: rd.append(x['reads_per_s']/i['reads_per_s'])
            p.append(x['write_p99_ms']/i['write_p99_ms'])
    print(f"{c:22s} writes x {' '.join(f'{a:.2f}' for a in w)} median {st.median(w):.2f} | reads x median {st.median(rd) if rd else 0:.2f} min {min(rd) if rd else 0:.2f} | wp99 x median {st.median(p):.2f}")
