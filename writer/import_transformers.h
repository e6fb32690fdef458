// Input reader for a directory that transformers' save_pretrained wrote: its
// safetensors weights (one file or a sharded index, through the safetensors
// importer) and its configuration and tokenizer files, attached byte for byte
// as archive-level bytes metadata "file:<name>" (spec §4.7.1).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "writer/importer.h"

namespace tsar::importer {

// The largest file attached (a tokenizer.json of a 256k-token vocabulary is
// about 35 MB); a larger one is skipped with a note.
inline constexpr uint64_t kMaxAttachedFileSize = 64ull << 20;

// The most bytes a directory's attached files may have in all. They stay in
// memory until the archive's head (which holds them, spec §4.7) is written:
// one copy read from the files, one in the encoded head, so `tsar pack DIR`
// holds at most twice this on top of what it maps. A directory whose files
// to attach are more is refused (kBadInput naming the file that crosses it).
inline constexpr uint64_t kMaxAttachedTotal = 256ull << 20;

// config.json is the model's configuration, which tsar.transformers.load_model
// builds the model from; nesting deeper than this is refused (a real one
// nests two or three levels; Python's json gives up near 1000).
inline constexpr int kMaxConfigDepth = 64;

// Why `name` (a regular file at the top of the directory, or under
// additional_chat_templates/) is not attached, or "" when it is: the rule is
// the names ending in .json, .txt, .model, .jinja or .tiktoken, except the
// weights' own index (*.safetensors.index.json), hidden names (a leading '.')
// and those over kMaxAttachedFileSize. Exposed for tests.
std::string AttachRefusal(const std::string& name, uint64_t size);

// Why `text`, the bytes of a config.json, is not a configuration
// tsar.transformers.load_model can read, or "" when it is: it must be UTF-8
// without a byte order mark (Python's json.loads refuses one), without a NUL
// byte, one JSON object, nested at most kMaxConfigDepth levels. Checked
// without building a JSON tree. Exposed for tests.
std::string ConfigRefusal(std::string_view text);

// `dir` (or its config.json) as writer/detect.h's kTransformers: entry
// options.default_entry holds the weights of TransformersWeights(dir) as the
// safetensors importer reads them (with their __metadata__ as archive
// metadata); every file the rule above attaches becomes archive-level bytes
// metadata "file:<name>", its exact bytes, each read once (a symbolic link is
// followed only when it leads to a file inside `dir`: one that leaves it is
// never read, and a directory it leads to is not listed); `skipped` lists
// every other file and directory, with the reason. config.json must be
// attached: one that is not a regular file inside `dir` (a link out without
// options.follow_symlinks, a FIFO), is over kMaxAttachedFileSize or fails
// ConfigRefusal is kBadInput naming it and why. Throws kBadInput (no
// config.json or weights, or one of those; the weights' own errors; attached
// files over kMaxAttachedTotal; a file that changes while read), kIo.
Imported ImportTransformers(const std::string& dir, const ImportOptions& options);

}  // namespace tsar::importer
