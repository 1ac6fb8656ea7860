/* Label mode (labels.rs; docs/network.md, "Routing by labels"). A frame
 * from one of this device's endpoints is decided once, here, by the whole
 * network program, and labelled: the endpoints it is for, in the next plane
 * of this device's push range. A labelled frame is forwarded by its label
 * alone, each neighbour port getting the bits its F-BM row holds, and the
 * device's own endpoints get the publisher's frame, the label popped.
 * On the wire: MACs, SUBC_LABEL_ETHERTYPE, plane byte, bit string
 * (endpoint e in bit e % 8 of byte e / 8), the frame's own EtherType. */
#define SUBC_LABEL_ETHERTYPE {{ l.ethertype }}
#define SUBC_LABEL_HEADER {{ l.header }}
#define SUBC_LABEL_PUSH {{ l.push }}
#define SUBC_LABEL_WORDS {{ l.words }}
#define SUBC_LABEL_PLANES {{ l.planes }}
#define SUBC_LABEL_ROWS {{ l.rows }}
#define SUBC_LABEL_HOSTS {{ l.hosts }}
/* Frames up to this long (labelled) can be popped: the payload moves back
 * over the header in 64-byte steps. */
#define SUBC_LABEL_MAX_FRAME 2048

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the bit string's bytes are read as the words of a port bitmap");

/* A packet's label: its plane and its endpoints, as a port bitmap. */
struct subc_label {
    __u64 w[SUBC_LABEL_WORDS];
    __u32 plane;
};

/* The header of a labelled frame; nonzero if this device cannot forward it. */
static __always_inline int subc_label_read(struct __sk_buff *skb, struct subc_label *l)
{
    __u8 h[SUBC_LABEL_WORDS * 8 + 1] = {};
    if (bpf_skb_load_bytes(skb, 14, h, SUBC_LABEL_HEADER))
        return 1;
    l->plane = h[0];
    __builtin_memcpy(l->w, h + 1, SUBC_LABEL_WORDS * 8);
    return l->plane >= SUBC_LABEL_PLANES;
}

/* The header of the copy about to leave: its plane and its bits. */
static __always_inline int subc_label_write(struct __sk_buff *skb, __u32 plane, const __u64 *bits)
{
    __u8 h[SUBC_LABEL_WORDS * 8 + 1];
    h[0] = plane;
    __builtin_memcpy(h + 1, bits, SUBC_LABEL_WORDS * 8);
    return bpf_skb_store_bytes(skb, 14, h, SUBC_LABEL_HEADER, 0);
}

/* Push: room for the EtherType and the header after the MACs (any
 * protocol: bpf_skb_change_head grows the head, the MACs move to it). */
__attribute__((noinline)) int subc_label_push(struct __sk_buff *skb)
{
    __u8 eth[14];
    if (!skb || bpf_skb_load_bytes(skb, 0, eth, 12))
        return 1;
    if (bpf_skb_change_head(skb, SUBC_LABEL_PUSH, 0))
        return 1;
    eth[12] = SUBC_LABEL_ETHERTYPE >> 8;
    eth[13] = SUBC_LABEL_ETHERTYPE & 0xff;
    return bpf_skb_store_bytes(skb, 0, eth, 14, 0) != 0;
}

/* Pop: the frame's EtherType and payload move back over the header, and
 * the tail is trimmed. Not bpf_skb_adjust_room: it refuses frames whose
 * protocol (here the label's EtherType) is not IP. */
__attribute__((noinline)) int subc_label_pop(struct __sk_buff *skb)
{
    __u8 buf[64] = {};
    if (!skb)
        return 1;
    __u32 len = skb->len;
    if (len < 14 + SUBC_LABEL_PUSH || len > SUBC_LABEL_MAX_FRAME)
        return 1;
#pragma clang loop unroll(disable)
    for (__u32 at = 12 + SUBC_LABEL_PUSH; at < len && at < SUBC_LABEL_MAX_FRAME; at += 64) {
        __u32 n = len - at;
        if (n > 64)
            n = 64;
        if (n == 0)
            return 1;
        if (bpf_skb_load_bytes(skb, at, buf, n) || bpf_skb_store_bytes(skb, at - SUBC_LABEL_PUSH, buf, n, 0))
            return 1;
    }
    return bpf_skb_change_tail(skb, len - SUBC_LABEL_PUSH, 0) != 0;
}

/* One labelled copy to a neighbour port. */
static __always_inline void subc_label_send(struct __sk_buff *skb, __u32 port, __u32 pruned)
{
    struct subc_egress *e = bpf_map_lookup_elem(&subc_egress, &port);
    if (!e || !e->ifindex || e->ifindex == pruned)
        return;
    if (bpf_clone_redirect(skb, e->ifindex, 0) == 0)
        subc_count(port, skb->len);
}

/* Forward by label, then pop to this device's own endpoints in it.
 * `pushed`: the frame carries the header already. */
__attribute__((noinline)) int subc_label_forward(struct __sk_buff *skb, const struct subc_label *l, __u32 pushed)
{
    if (!skb || !l || l->plane >= SUBC_LABEL_PLANES)
        return SUBC_TC_ACT_SHOT;
    __u32 pruned = subc_pruned_ifindex(skb->ingress_ifindex);
    __u32 plane = l->plane;
#pragma clang loop unroll(disable)
    for (__u32 i = 0; i < SUBC_LABEL_ROWS; i++) {
        __u32 key = plane * SUBC_LABEL_ROWS + i;
        struct subc_label_row *row = bpf_map_lookup_elem(&subc_label_rows, &key);
        if (!row || !row->used)
            continue;
        __u64 part[SUBC_LABEL_WORDS];
        __u64 any = 0;
{% for w in l.word_list %}        part[{{ w }}] = l->w[{{ w }}] & row->fbm[{{ w }}];
        any |= part[{{ w }}];
{% endfor %}        if (!any)
            continue;
        if (!pushed) {
            if (subc_label_push(skb))
                return SUBC_TC_ACT_SHOT;
            pushed = 1;
        }
        if (subc_label_write(skb, plane, part))
            return SUBC_TC_ACT_SHOT;
        subc_label_send(skb, row->port, pruned);
    }
    struct subc_pkt k = {};
    __u32 popped = !pushed;
#pragma clang loop unroll(disable)
    for (__u32 i = 0; i < SUBC_LABEL_HOSTS; i++) {
        /* A key of its own: the counter stays in a register the verifier tracks. */
        __u32 slot = i;
        struct subc_label_host *h = bpf_map_lookup_elem(&subc_label_hosts, &slot);
        if (!h || !h->used)
            continue;
        __u32 e = h->endpoint;
        barrier_var(e);
        if (e >= SUBC_LABEL_WORDS * 64 || !((l->w[e / 64] >> (e % 64)) & 1))
            continue;
        if (!popped) {
            if (subc_label_pop(skb))
                return SUBC_TC_ACT_SHOT;
            popped = 1;
        }
        subc_tc_copy(skb, h->port, &k, pruned);
    }
    return SUBC_TC_ACT_SHOT;
}

/* The endpoint of this device whose port the frame came in on (the
 * publisher), or -1 if it came from none. */
static __always_inline __s64 subc_label_publisher(__u32 ingress)
{
#pragma clang loop unroll(disable)
    for (__u32 i = 0; i < SUBC_LABEL_HOSTS; i++) {
        /* A key of its own: the counter stays in a register the verifier tracks. */
        __u32 slot = i;
        struct subc_label_host *h = bpf_map_lookup_elem(&subc_label_hosts, &slot);
        if (!h || !h->used)
            continue;
        __u32 port = h->port;
        struct subc_egress *e = bpf_map_lookup_elem(&subc_egress, &port);
        if (e && e->ifindex && e->ifindex == ingress)
            return h->endpoint;
    }
    return -1;
}

/* The plane of the next packet labelled here: base + n mod count, n the
 * device's packet count, one atomic add shared by every CPU, so that packet
 * n takes the same plane whichever CPU runs it. The push range (base,
 * count) is one bank of the planes held; a reroute installs the other bank
 * and then moves the range to it (labels.rs, make-before-break). */
static __always_inline __u32 subc_label_next_plane(__u32 base, __u32 count)
{
    __u32 zero = 0;
    __u64 *sent = bpf_map_lookup_elem(&subc_label_sent, &zero);
    if (!sent || !count)
        return base;
    return base + __sync_fetch_and_add(sent, 1) % count;
}

SEC("tc")
int subc_tc(struct __sk_buff *skb)
{
    struct subc_label l = {};
    __u16 type = 0;
    if (bpf_skb_load_bytes(skb, 12, &type, 2) == 0 && type == bpf_htons(SUBC_LABEL_ETHERTYPE))
        return subc_label_read(skb, &l) ? SUBC_TC_ACT_SHOT : subc_label_forward(skb, &l, 1);
    /* Unlabelled: decided here if it comes from an endpoint of an ingress. */
    __u32 zero = 0;
    struct subc_label_cfg *c = bpf_map_lookup_elem(&subc_label_cfg, &zero);
    __s64 publisher = subc_label_publisher(skb->ingress_ifindex);
    if (!c || !c->ingress || publisher < 0)
        return subc_no_match_drops() ? SUBC_TC_ACT_SHOT : SUBC_TC_ACT_OK;
    __u32 push_base = c->push_base, push_count = c->push_count;
    struct subc_result r = {};
    if (skb->data + SUBC_MAX_PARSE_BYTES > skb->data_end && skb->len > skb->data_end - skb->data)
        bpf_skb_pull_data(skb, skb->len < SUBC_MAX_PARSE_BYTES ? skb->len : SUBC_MAX_PARSE_BYTES);
    subc_run((void *)(long)skb->data, (void *)(long)skb->data_end, &r);
    subc_record_result(&r);
    /* Every packet decided here takes a plane, as LabelSimulator counts. */
    l.plane = subc_label_next_plane(push_base, push_count);
    if (r.decision == SUBC_DROP)
        return SUBC_TC_ACT_SHOT;
    if (r.decision != SUBC_FORWARD)
        return subc_no_match_drops() ? SUBC_TC_ACT_SHOT : SUBC_TC_ACT_OK;
    /* The endpoints it is for, the publisher left out. */
{% for w in l.word_list %}    l.w[{{ w }}] = r.ports[{{ w }}];
    if (publisher / 64 == {{ w }})
        l.w[{{ w }}] &= ~(1ULL << (publisher % 64));
{% endfor %}    return subc_label_forward(skb, &l, 0);
}

