import Foundation

/// Network faults between test hosts, made by the kernel: nftables rules in the hosts' namespaces, on what each host
/// sends. A cut host's packets are dropped silently, as a firewall or a dead switch port drops them — nothing tells
/// either end, and TCP finds out only by its own timers.
///
/// Delay, jitter and reordering: ``PacketDelay`` (a netfilter queue, since not every kernel has netem).
extension TestHosts {
    /// The nftables table each host's faults live in.
    static let faultTable = "lockstep_faults"

    /// Drops `percent` % (100: all) of the packets host `from` sends to host `to`, chosen at random per packet
    /// (nftables' `numgen random`); the other direction is untouched unless it is impaired too. Adds to what is set.
    ///
    /// - Throws: ``TestHostsUnavailable`` when `nft` (Debian's nftables) is missing, ``TestHostsError`` when a rule
    ///   cannot be set.
    public func drop(from: String, to: String, percent: Int = 100) throws {
        precondition((1...100).contains(percent), "drop 1 to 100 % of the packets, not \(percent)")
        let chance = percent == 100 ? [] : ["numgen", "random", "mod", "100", "<", "\(percent)"]
        try nft(on: from, ["add", "table", "inet", Self.faultTable])
        try nft(
            on: from,
            [
                "add", "chain", "inet", Self.faultTable, "output", "{", "type", "filter", "hook", "output", "priority",
                "0", ";",
                "policy", "accept", ";", "}",
            ]
        )
        try nft(
            on: from,
            ["add", "rule", "inet", Self.faultTable, "output", "ip", "daddr", self[to].address] + chance + ["drop"]
        )
    }

    /// Cuts hosts `a` and `b` apart: all they send each other is dropped.
    public func cut(_ a: String, _ b: String) throws {
        try drop(from: a, to: b)
        try drop(from: b, to: a)
    }

    /// Removes every fault set on every host: the network is whole again.
    public func heal() throws {
        for host in hosts {
            try nft(on: host.name, ["add", "table", "inet", Self.faultTable])
            try nft(on: host.name, ["delete", "table", "inet", Self.faultTable])
        }
    }

    /// Runs `nft` with `arguments` on host `name`.
    private func nft(on name: String, _ arguments: [String]) throws {
        guard
            let nft = ["/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft"].first(where: FileManager.default.isExecutableFile)
        else {
            throw TestHostsUnavailable(
                reason: "no 'nft' in /usr/sbin, /sbin or /usr/bin; install nftables (make deps does)"
            )
        }
        try ip(["netns", "exec", self[name].namespace, nft] + arguments)
    }
}
