// Input reader for a directory that transformers' save_pretrained wrote: its
// safetensors weights (one file or a sharded index, through the safetensors
// importer) and its configuration and tokenizer files, attached byte for byte
// as archive-level bytes metadata "file:<name>" (spec §4.7.1).
#pragma once

#include <cstdint>
#include <string>

#include "writer/importer.h"

namespace tsar::importer {

// The largest file attached (a tokenizer.json of a 256k-token vocabulary is
// about 35 MB); a larger one is skipped with a note.
inline constexpr uint64_t kMaxAttachedFileSize = 64ull << 20;

// Why `name` (a regular file at the top of the directory, or under
// additional_chat_templates/) is not attached, or "" when it is: the rule is
// the names ending in .json, .txt, .model, .jinja or .tiktoken, except the
// weights' own index (*.safetensors.index.json), hidden names (a leading '.')
// and those over kMaxAttachedFileSize. Exposed for tests.
std::string AttachRefusal(const std::string& name, uint64_t size);

// `dir` (or its config.json) as writer/detect.h's kTransformers: entry
// options.default_entry holds the weights of TransformersWeights(dir) as the
// safetensors importer reads them (with their __metadata__ as archive
// metadata); every file the rule above attaches becomes archive-level bytes
// metadata "file:<name>", its exact bytes (a symbolic link is followed only
// when it leads to a file inside `dir`: one that leaves it is never read);
// `skipped` lists every other file and directory, with the reason. Throws kBadInput (no config.json or
// weights; the weights' own errors; a file that changes while read), kIo.
Imported ImportTransformers(const std::string& dir, const ImportOptions& options);

}  // namespace tsar::importer
