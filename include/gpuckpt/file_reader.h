// FileReader: random reads of one regular file of a snapshot.
//
// A read costs one seek in the file's extent index plus the chunks it
// touches; the file's holes (FileEntry::holes) read as zeros and cost
// nothing. Chunks come from the Store's shared cache or from disk, where
// they are decompressed and checked as StoreOptions::verify_on_read says
// (by default against the checksum kept in the chunk's record): a chunk
// that fails the check fails the read with kCorruption, never returns
// wrong data.
//
// Safe for concurrent use: Pread() may be called from several threads at
// once. Borrows the Store, which must outlive it. A reader keeps its
// snapshot readable for as long as it lives: if the snapshot is removed
// while the reader is open (Store::Remove), the reader goes on returning the
// same bytes, also across Store::Gc(), which frees the snapshot's space only
// after the last of its readers is destroyed.
#ifndef GPUCKPT_FILE_READER_H_
#define GPUCKPT_FILE_READER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpuckpt/status.h"
#include "gpuckpt/store_types.h"

namespace gpuckpt {

class FileReader {
 public:
  virtual ~FileReader() = default;

  // Reads up to `len` bytes at `offset` into `buf`; returns the count, which
  // is short only at end of file (0 at or past it).
  virtual Result<size_t> Pread(uint64_t offset, size_t len, char* buf) = 0;

  // The same bytes as Pread(), where they already lie, for a caller that
  // hands them on without copying them (a FUSE reply's iovecs): `pieces`,
  // in order, are the bytes read; each points into memory that `held`
  // keeps alive (a decoded chunk, the buffer raw chunks were read into, a
  // buffer of this read) or into zeros that live as long as the process,
  // valid for as long as the ReadPieces lives. Hold it only as long as the
  // request it answers: a read buffer is a few MiB.
  struct Piece {
    const char* data = nullptr;
    size_t size = 0;
  };
  struct ReadPieces {
    std::vector<Piece> pieces;
    std::vector<std::shared_ptr<const void>> held;
    size_t size() const {
      size_t n = 0;
      for (const Piece& p : pieces) n += p.size;
      return n;
    }
  };
  // By default, Pread() into a buffer of its own: one piece.
  virtual Result<ReadPieces> Read(uint64_t offset, size_t len) {
    auto buffer = std::make_shared<std::string>(len, '\0');
    GPUCKPT_ASSIGN_OR_RETURN(size_t n, Pread(offset, len, buffer->data()));
    ReadPieces out;
    if (n > 0) out.pieces.push_back(Piece{buffer->data(), n});
    out.held.push_back(std::move(buffer));
    return out;
  }

  virtual const FileEntry& entry() const = 0;
};

}  // namespace gpuckpt

#endif  // GPUCKPT_FILE_READER_H_
