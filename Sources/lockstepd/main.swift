import Foundation

// The daemon runtime (LockstepServer) is not part of the build yet. Say so plainly rather than pretend.
FileHandle.standardError.write(
    Data(
        """
        lockstepd: the daemon is not available in this build yet; use 'lockstep run' and 'lockstep demo' for \
        in-process stores.

        """.utf8
    )
)
exit(69)
