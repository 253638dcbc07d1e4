import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// SIGHUP, turned into a byte on the loop's wake-up pipe (the self-pipe trick).
///
/// A DispatchSource is not reliable for this on Linux: libdispatch reads signals through a signalfd, and a
/// thread that does not block the signal (the loop's, libzmq's) may take it first and drop it. A real
/// handler runs on whichever thread the kernel picks, and does only async-signal-safe things: an atomic
/// store and a `write(2)`.
enum HangupSignal {
    private static let descriptor = Atomic<Int32>(-1)
    private static let pending = Atomic<Bool>(false)

    /// Installs the handler; each SIGHUP then writes to `wakeDescriptor`.
    static func install(wakeDescriptor: Int32) {
        descriptor.store(wakeDescriptor, ordering: .releasing)
        var action = sigaction()
        action.__sigaction_handler.sa_handler = { _ in
            HangupSignal.pending.store(true, ordering: .releasing)
            var byte: UInt8 = 1
            _ = write(HangupSignal.descriptor.load(ordering: .acquiring), &byte, 1)
        }
        sigemptyset(&action.sa_mask)
        action.sa_flags = SA_RESTART
        sigaction(SIGHUP, &action, nil)
    }

    /// Whether a SIGHUP came since the last call.
    static func take() -> Bool {
        pending.exchange(false, ordering: .acquiringAndReleasing)
    }
}
