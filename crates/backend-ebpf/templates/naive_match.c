/* The naive baseline: the rules (one per cube of each subscription's normal
 * form) in an array, every one tested against the packet. */
struct subc_naive_ctx {
    __u64 q[{{ queries.len() }}];
    __u64 ports[SUBC_PORT_WORDS];
    __u32 drop;
};

static long subc_naive_cb(__u32 i, void *vctx)
{
    struct subc_naive_ctx *c = vctx;
    struct subc_rule *rule = bpf_map_lookup_elem(&subc_rules, &i);
    if (!rule)
        return 1;
{% for q in queries %}    if (c->q[{{ loop.index0 }}] < rule->lo[{{ loop.index0 }}] || c->q[{{ loop.index0 }}] > rule->hi[{{ loop.index0 }}])
        return 0;
{% endfor %}{% for w in port_word_list %}    c->ports[{{ w }}] |= rule->ports[{{ w }}];
{% endfor %}    c->drop |= rule->drop;
    return 0;
}

static __always_inline void subc_naive(struct subc_result *r{% for q in queries %}, __u64 q{{ loop.index0 }}{% endfor %})
{
    struct subc_naive_ctx c = {};
{% for q in queries %}    c.q[{{ loop.index0 }}] = q{{ loop.index0 }};
{% endfor %}    bpf_loop({{ naive_rules }}, subc_naive_cb, &c, 0);
{% for w in port_word_list %}    r->ports[{{ w }}] = c.ports[{{ w }}];
{% endfor %}    r->drop = c.drop;
}
