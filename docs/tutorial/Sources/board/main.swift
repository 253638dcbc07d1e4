import Kanban
import LockstepTool

// The tool: run, replay, dispatch, state, tail, stats, journal verify|dump|stats — `board --help`.
await LockstepToolMain.run(domains: [Board.self])
