import sys, re, collections
from perf_stacks import INNER, samples

inner_pat = re.compile(INNER)
tot=0; tsr=0; own=0
own_leaf=collections.Counter(); own_tsr=collections.Counter(); own_cat=collections.Counter()
for head, frames in samples(sys.stdin):
    tot+=1
    idx=[i for i,s in enumerate(frames) if 'tower_sqlite_retry' in s]
    if not idx: continue
    tsr+=1
    leafmost=idx[0]
    below=frames[:leafmost]
    if any(inner_pat.search(s) for s in below): continue
    own+=1
    own_leaf[frames[0][:110]]+=1
    own_tsr[frames[leafmost][:140]]+=1
    cat='other'
    b=' '.join(below)
    if re.search(r'malloc|free|realloc|alloc::',b): cat='alloc/free'
    if 'copy_head' in frames[leafmost] or any('copy_head' in s for s in frames[leafmost:leafmost+3]): cat='head copy ('+cat+')'
    if re.search(r'tracing|Span|span',b): cat='tracing'
    if re.search(r'Extensions',b): cat='extensions'
    if re.search(r'HeaderMap|HeaderValue|header::',b) and cat=='other': cat='headers'
    own_cat[cat]+=1
print(f"samples {tot}; with a tower_sqlite_retry frame {tsr}; the layer's own (no inner-service frame below) {own} = {100*own/max(tot,1):.2f}%")
print("-- own, by leafmost tower_sqlite_retry frame"); [print(f"{n:6} {s}") for s,n in own_tsr.most_common(12)]
print("-- own, by leaf symbol"); [print(f"{n:6} {s}") for s,n in own_leaf.most_common(25)]
print("-- own, by category"); [print(f"{n:6} {s}") for s,n in own_cat.most_common()]
