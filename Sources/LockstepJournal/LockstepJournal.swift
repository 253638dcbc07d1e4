// LockstepJournal
