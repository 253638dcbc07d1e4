// LockstepProtocol
