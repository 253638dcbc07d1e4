import Foundation
import LockstepExamples
import LockstepTesting
import ReplayFixtures

// A child replica for the harness's tests: the broken domains and the examples.
exit(ReplayChild.serve(domains: brokenDomains + Examples.domains))
