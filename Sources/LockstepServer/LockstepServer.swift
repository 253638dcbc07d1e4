// LockstepServer
