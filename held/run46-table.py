import json, sys, os
# The table of held/run46-call.sh: the selection benches of each build, round by round.
out = sys.argv[1]
def recs(n, r):
    p = f"{out}/sel-{n}-{r}.json"
    if not os.path.exists(p): return {}
    try: return {(x["kind"], x["rows"], x["tokens"], x["index_keys"]): x for x in json.load(open(p))["select"]}
    except Exception as e: print(p, e); return {}
def table(names, fields):
    print("case | field | " + " | ".join(f"{n} r1 r2" for n in names))
    keys = set()
    for n in names: keys |= set(recs(n, 1))
    for k in sorted(keys):
        for f in fields:
            row = []
            for n in names:
                for r in (1, 2):
                    v = recs(n, r).get(k, {}).get(f)
                    row.append("%.2f" % v if v is not None else "-")
            if any(x != "-" for x in row): print(*k, f, " ".join(row))
table(["tree-dec", "filt-dec"], ("us", "us_l2_flushed"))
table(["tree-pre", "split-pre", "chunks-pre", "chunks4-pre"], ("us_l2_flushed", "score_us_l2_flushed"))
