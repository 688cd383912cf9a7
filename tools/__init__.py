"""Measurement tools: each runs as `.venv/bin/python -m omnidraft.tools.NAME ARGS`
(`--help` says what it measures and how to run it). None is part of the app or
the engine; they load the bundled models and time them, so run them on a quiet
machine.

  step_times          ms a forward of the target and the drafter, by tokens a forward
  kernel_ab           a git revision's kernels against the working tree's: a drafter
                      step, the target-shaped products (--gemm), a prompt read (--prompt)
  attention_ab        a revision's kernels against the working tree's on a whole forward
                      at growing context lengths, and whether the logits stay bit for bit
  conversation_speed  a long conversation's speed turn by turn: plain, omnidraft, llama.cpp
  serve_speed         the local server's tokens/s against in-process and llama-server, 1 and 4 clients
  reply_agreement     how alike two bench reports' replies are, method by method
  learning_sweep      the learner's settings offline: how fast the drafter learns a target
  speed_floor         memory bandwidth, the decoding floor it sets, CPU matmul kernels' costs
  memory_soak         the engine worker's memory over a long session with learning on
  load_footprint      a target's load time and RSS, peak and after a first reply, in a fresh process
  synthetic_gguf      writes a 7B-shaped GGUF (Q4_K_M mix, random blocks) to time a large target
  code_block_stall    the chat window's event-loop stalls over a long highlighted code block
  search_index_size   the search index's memory and query time over many chats
  bundle_check        the built desktop bundle started as a new user would: window, first reply
  gui_check           the real desktop app driven once: event-loop stalls, screenshots
  make_streams        builds eval/streams/: one person's chat streams for
                      `omnidraft-bench --stream` (nothing timed, no model loaded)

What they share (parsers, argument types, default prompt files, kernel builds)
is in tools/common.py.
"""
