// LockstepTesting
