"""Who acts: leader election (leader), the shards a replica holds (shards), and the scope a
write is made under, with the writes of a term that may still land (scope).

May import: core, model, kube.
"""
