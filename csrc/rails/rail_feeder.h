// The fence in front of a rail for a mover whose steps finish later than the
// schedule issues them (a device): each task is handed to the rail in slice
// order, once the work that fills its chunk has finished.  Used by the CUDA
// staged rail (the chunk's device-to-host copy) and by its CPU emulation in
// the tests (a deferred stream's step), so both run this one loop.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "rails/rail_exchange.h"

namespace fairring {

class RailFeeder {
 public:
  // Polled from the feeder's thread until true (never from the rail's, which
  // must not wait on a device); may throw.
  using Finished = std::function<bool()>;

  // `waiting_for` names the work in the timeout's message ("the GPU's copy of
  // a reduced chunk"); a task whose work takes longer than `timeout` fails
  // the rail through `failed`, attributed to `rank`.  `on_start` runs first on
  // the feeder's thread (e.g. to select the device).
  RailFeeder(RailExchange& rail, int rank, std::string waiting_for, std::chrono::milliseconds timeout,
             RailExchange::Failed failed, std::function<void()> on_start = {});
  // Stops (if not yet) and joins the thread.
  ~RailFeeder();

  void push(RailTask task, Finished finished);
  // Nothing more is handed to the rail.  From any thread, the feeder's
  // included (it may fail the group, which aborts the rail): no join here.
  void stop();

 private:
  struct Item {
    RailTask task;
    Finished finished;
  };
  void loop();
  bool stopping();

  RailExchange& rail_;
  const int rank_;
  const std::string waiting_for_;
  const std::chrono::milliseconds timeout_;
  RailExchange::Failed failed_;
  std::function<void()> on_start_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> items_;
  bool stopping_ = false;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace fairring
