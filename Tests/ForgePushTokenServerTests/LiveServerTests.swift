import ServerSupport
import Testing

/// Every test that runs a live server, one at a time.
///
/// These tests block their thread on socket reads. Swift Testing runs tests on the cooperative
/// thread pool, which has one thread per core (two here); the server's event broadcaster is a task
/// on that same pool. Serialising the live tests leaves the pool room to run it.
@Suite(.serialized) enum LiveServerTests {}
