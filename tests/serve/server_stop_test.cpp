// Server::stop() right after start() returns: httplib's stop() is lost when it comes before the
// listener thread marks itself running, and join() then waits in accept() forever (serve hung after
// a model that failed to load at once). Each round has a watchdog; a hang fails instead of blocking.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include "serve/server.h"

namespace roofline::serve {
namespace {

TEST(ServerStop, StopRightAfterStartAlwaysReturns) {
  for (int round = 0; round < 200; ++round) {
    // A detached thread: a hung round is left behind (and fails the test) rather than joined.
    auto finished = std::make_shared<std::promise<void>>();
    std::future<void> done = finished->get_future();
    std::thread([finished] {
      ServerOptions o;
      o.port = 0;
      o.threads_http = 1;
      Server s(o);
      s.bind();
      s.start();
      s.stop();
      finished->set_value();
    }).detach();
    ASSERT_EQ(done.wait_for(std::chrono::seconds(5)), std::future_status::ready) << "round " << round << " hung in stop()";
  }
}

}  // namespace
}  // namespace roofline::serve
