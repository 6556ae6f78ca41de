//! Condition diffing and the Lease election.
