// Hadoop's raw local file system, with a new file's permission set in this process.
//
// Built by runtime/spark/local_fs.py (see its docstring for why and how it is used). Without
// Hadoop's native library, which PySpark does not ship, RawLocalFileSystem runs `chmod` in a
// child process for every file it creates; a streaming query creates two a micro-batch (its
// offset and commit logs). Here the same permission bits are set through java.nio instead.
package twinflow.spark;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

public class NoForkLocalFileSystem extends RawLocalFileSystem {
  // Bit i of a mode (octal 0777) is BITS[i]: others' x, w, r, then group's, then owner's.
  private static final PosixFilePermission[] BITS = {
    PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_READ,
    PosixFilePermission.GROUP_EXECUTE, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
    PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_READ,
  };

  @Override
  public void setPermission(Path p, FsPermission permission) throws IOException {
    short mode = permission.toShort();
    if ((mode & ~0777) != 0) {
      // Sticky, setuid or setgid: java.nio cannot set them; Hadoop's own way can.
      super.setPermission(p, permission);
      return;
    }
    Set<PosixFilePermission> perms = EnumSet.noneOf(PosixFilePermission.class);
    for (int i = 0; i < BITS.length; i++) {
      if ((mode & (1 << i)) != 0) {
        perms.add(BITS[i]);
      }
    }
    Files.setPosixFilePermissions(pathToFile(p).toPath(), perms);
  }
}
