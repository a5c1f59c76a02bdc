/*
 * reason.c - names of the fallback reasons (see reason.h).
 */
#include "reason.h"

static const struct {
	const char *id;
	const char *text;
} reasons[R_COUNT] = {
	[R_NONE]            = { "none", "accelerated" },
	[R_PEER_NO_SMCLO]   = { "peer-no-smclo", "peer has no smclo" },
	[R_NOT_THIS_HOST]   = { "not-this-host", "peer not on this host or namespace" },
	[R_MAX_BUFFERS]     = { "max-buffers", "max buffers reached" },
	[R_NO_MEMORY]       = { "no-memory", "out of shared memory" },
	[R_TIMEOUT]         = { "timeout", "handshake timeout" },
	[R_IO_URING]        = { "io-uring", "io_uring unseen (not through liburing), or used on the socket: on TCP" },
	[R_DIFF_USER]       = { "different-user", "peer runs as a different user" },
	[R_TUPLE_BUSY]      = { "tuple-busy", "address tuple busy in registry" },
	[R_PROOF_FAILED]    = { "proof-failed", "peer failed the same-connection proof" },
	[R_DEFER_ACCEPT]    = { "defer-accept", "listener defers accept" },
	[R_HANDSHAKE_ERROR] = { "handshake-error", "malformed handshake" },
	[R_PEER_WITHDREW]   = { "peer-withdrew", "client gave up before the answer" },
	[R_NO_PORT]         = { "no-port", "no ephemeral port for the rendezvous" },
	[R_NO_REGISTRY]     = { "no-registry", "registry directory unusable" },
	[R_CROSS_NETNS_OFF] = { "cross-netns-off", "cross-namespace acceleration disabled" },
	[R_SHORT_LIVED]     = { "short-lived", "short-lived, kept on TCP while CPU time is short" },
	[R_DIRECT_ENDED]    = { "direct-ended", "listener stopped taking connections without TCP" },
	[R_EXEC_NO_SMCLO]   = { "exec-no-smclo", "handed to a program that cannot load smclo: reset" },
	[R_HANDOVER_LOST]   = { "handover-lost", "handed over on exec, but its state did not arrive: reset" },
	[R_EPOLL_EARLY]     = { "epoll-before-connect", "registered in epoll before connect(): kept on TCP" },
	[R_UNVERIFIED]      = { "unverified-user", "the other end's user not shown to own its TCP socket" },
	[R_PRIVATE_REGISTRY] = { "private-registry", "only this user's registry (the shared one is unusable)" },
	[R_SANDBOX]         = { "sandbox", "the process confines itself (seccomp, fd limit): on TCP" },
	[R_PEER_MOVED]      = { "peer-moved", "the peer moved the connection to TCP" },
	[R_URGENT]          = { "urgent-data", "urgent data sent (MSG_OOB): on TCP" },
	[R_KERNEL_TLS]      = { "kernel-tls", "kernel TLS (TCP_ULP) set: on TCP, where the kernel encrypts" },
	[R_OFFER_MISSED]    = { "offer-missed", "the server accepted without finding the offer: on TCP" },
	[R_HANDED_ON]       = { "handed-on", "handed to a program without smclo, nothing unread: on TCP" },
};

const char *reason_id(int r)
{
	return (r >= 0 && r < R_COUNT) ? reasons[r].id : "unknown";
}

const char *reason_text(int r)
{
	return (r >= 0 && r < R_COUNT) ? reasons[r].text : "unknown reason";
}
