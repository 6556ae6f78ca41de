//! The free-block queue: O(1) push to the tail, pop from the head and removal from the middle
//! (a cached free block that gets a hit leaves the queue). An intrusive doubly linked list
//! over block ids, like vLLM's `FreeKVCacheBlockQueue`.

const NIL: u32 = u32::MAX;

#[derive(Debug)]
pub struct FreeList {
    prev: Vec<u32>,
    next: Vec<u32>,
    in_list: Vec<bool>,
    head: u32,
    tail: u32,
    len: usize,
}

impl FreeList {
    /// A queue holding blocks `0..n` in order.
    pub fn with_all(n: usize) -> Self {
        let mut list = Self::empty(n);
        for id in 0..n as u32 {
            list.push_back(id);
        }
        list
    }

    /// An empty queue over ids `0..n`.
    pub fn empty(n: usize) -> Self {
        Self {
            prev: vec![NIL; n],
            next: vec![NIL; n],
            in_list: vec![false; n],
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn push_back(&mut self, id: u32) {
        let i = id as usize;
        if self.in_list[i] {
            return;
        }
        self.in_list[i] = true;
        self.prev[i] = self.tail;
        self.next[i] = NIL;
        if self.tail == NIL {
            self.head = id;
        } else {
            self.next[self.tail as usize] = id;
        }
        self.tail = id;
        self.len += 1;
    }

    pub fn pop_front(&mut self) -> Option<u32> {
        if self.is_empty() {
            return None;
        }
        let id = self.head;
        self.remove(id);
        Some(id)
    }

    pub fn remove(&mut self, id: u32) {
        let i = id as usize;
        if !self.in_list[i] {
            return;
        }
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.in_list[i] = false;
        self.len -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_with_removal_from_the_middle() {
        let mut q = FreeList::with_all(4);
        q.remove(1);
        assert_eq!(q.len(), 3);
        q.push_back(1);
        q.push_back(1); // idempotent
        let order: Vec<_> = std::iter::from_fn(|| q.pop_front()).collect();
        assert_eq!(order, vec![0, 2, 3, 1]);
        assert!(q.is_empty());
        q.remove(2); // not in the list: no-op
        assert_eq!(q.len(), 0);
    }
}
