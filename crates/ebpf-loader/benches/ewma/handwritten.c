// SPDX-License-Identifier: GPL-2.0
// The EWMA job of seed 002, written by hand as its post describes it: the
// bench's baseline for the program subc generates from
// examples/ewma-channels. TC; one slot per channel (0..63) holding a
// spin lock, a ring buffer of the last BUF_DEPTH samples (timestamp and
// value) and the EWMA in fixed point (<< EWMA_SHIFT). When a sample moves
// the average by more than old >> THRESH_SHIFT, once the buffer is full,
// the packet gets pod B's MACs and bpf_redirect_peer; otherwise it goes on
// to pod A through the stack.
//
// The same meaning as the example's `ewma(sample.value, shift = 3,
// spike = 2, warmup = 10)`: the first sample starts the average, and a
// spike needs BUF_DEPTH earlier samples.

#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/in.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <stdbool.h>
#include <stddef.h>

#define BUF_DEPTH 10
#define EWMA_SHIFT 8   /* fixed point: 8 fractional bits */
#define ALPHA_SHIFT 3  /* weight 1/8 per sample */
#define THRESH_SHIFT 2 /* a spike moves the average by more than a quarter */
#define SAMPLE_PORT 9000
#define CHANNELS 64

struct sample {
    __u64 ts;
    __u32 val;
};

/* Struct for a channel, its recent samples and the EWMA derived from them */
struct chan_stats {
    struct bpf_spin_lock lock;            /* Avoid cores racing on channels */
    struct sample samples_buf[BUF_DEPTH]; /* Ring buffer for recent samples */
    __u8 next;                            /* Next index to overwrite */
    __u8 count;                           /* Up to BUF_DEPTH */
    __u64 ewma;                           /* Current EWMA << EWMA_SHIFT */
};

/* Map for channels and their stats, one slot per channel 0..63 */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, CHANNELS);
    __type(key, __u32);
    __type(value, struct chan_stats);
} chan_stats_map SEC(".maps");

/* Pod B: the host side of its veth pair, and the MACs a frame needs there. */
const volatile __u32 host_veth_ifindex = 1;
const __u8 host_veth_mac[ETH_ALEN] = {0x02, 0x00, 0x00, 0x00, 0x01, 0x02};
const __u8 container_veth_mac[ETH_ALEN] = {0x02, 0x00, 0x00, 0x00, 0x02, 0x02};

struct payload {
    __u8 channel;
    __u32 value;
} __attribute__((packed));

static __always_inline void ring_insert(struct chan_stats *cs, __u64 ts, __u32 val)
{
    __u32 i = cs->next;
    if (i >= BUF_DEPTH)
        i = 0;
    cs->samples_buf[i].ts = ts;
    cs->samples_buf[i].val = val;
    cs->next = i + 1 == BUF_DEPTH ? 0 : i + 1;
    if (cs->count < BUF_DEPTH)
        cs->count++;
}

static __always_inline void update_ewma(struct chan_stats *cs, __u32 val, bool first)
{
    __u64 x = (__u64)val << EWMA_SHIFT;
    if (first)
        cs->ewma = x;
    else if (x >= cs->ewma)
        cs->ewma += (x - cs->ewma) >> ALPHA_SHIFT;
    else
        cs->ewma -= (cs->ewma - x) >> ALPHA_SHIFT;
}

SEC("tc")
int ewma_redirect(struct __sk_buff *skb)
{
    void *data = (void *)(long)skb->data;
    void *data_end = (void *)(long)skb->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
        return TC_ACT_OK;
    struct iphdr *ip = (void *)(eth + 1);
    if ((void *)(ip + 1) > data_end || ip->ihl != 5 || ip->protocol != IPPROTO_UDP)
        return TC_ACT_OK;
    struct udphdr *udp = (void *)(ip + 1);
    if ((void *)(udp + 1) > data_end || udp->dest != bpf_htons(SAMPLE_PORT))
        return TC_ACT_OK;
    struct payload *p = (void *)(udp + 1);
    if ((void *)(p + 1) > data_end)
        return TC_ACT_OK;
    __u32 chan = p->channel;
    __u32 val = bpf_ntohl(p->value);
    if (chan >= CHANNELS)
        return TC_ACT_OK;
    struct chan_stats *cs = bpf_map_lookup_elem(&chan_stats_map, &chan);
    if (!cs)
        return TC_ACT_OK;
    __u64 ts = bpf_ktime_get_ns();

    bool should_redirect = false;
    /* Acquire lock to avoid other cores racing on the same channel */
    bpf_spin_lock(&cs->lock);
    /* BUF_DEPTH earlier samples: enough history to analyse this one */
    bool warm = cs->count == BUF_DEPTH;
    bool first = cs->count == 0;
    ring_insert(cs, ts, val);
    __u64 old_ewma = cs->ewma;
    update_ewma(cs, val, first);
    if (warm) {
        __u64 delta = cs->ewma > old_ewma ? cs->ewma - old_ewma : old_ewma - cs->ewma;
        /* old_ewma is in fixed point; >> THRESH_SHIFT is old / 2^THRESH_SHIFT */
        if (delta > (old_ewma >> THRESH_SHIFT))
            should_redirect = true;
    }
    bpf_spin_unlock(&cs->lock);

    if (!should_redirect)
        return TC_ACT_OK;
    /* bpf_redirect_peer does not rewrite the Ethernet header: do it here */
    bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_source), host_veth_mac, ETH_ALEN, 0);
    bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_dest), container_veth_mac, ETH_ALEN, 0);
    return bpf_redirect_peer(host_veth_ifindex, 0);
}

char _license[] SEC("license") = "GPL";
